"""Fixtures for operator tests: a fake API holding the example CR and its key Secret."""

from __future__ import annotations

import pytest
from agentserve_operator.fake import FakeCluster
from operator_cases import GPU_CR, SECRET


@pytest.fixture
def cluster() -> FakeCluster:
    """A fake API with the key Secret and the CR stored (uid assigned)."""
    fake = FakeCluster()
    fake.put(SECRET)
    fake.put(GPU_CR)
    return fake

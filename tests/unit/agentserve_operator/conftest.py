"""Fixtures for operator tests: a fake API holding the example CR and its key Secret."""

from __future__ import annotations

import pytest
from agentserve_operator.fake import FakeCluster
from operator_cases import GPU_CR, MODELS_PVC, SECRET


@pytest.fixture
def cluster() -> FakeCluster:
    """A fake API with the key Secret, the model claim (both labelled for the CR to
    reference) and the CR stored (uid assigned)."""
    fake = FakeCluster()
    fake.put(SECRET)
    fake.put(MODELS_PVC)
    fake.put(GPU_CR)
    return fake

"""Example 03 unchanged against the real engine: `agentserve up` with example 03's own spec
(bundled SmolLM2 on vLLM, CPU, two tenants). Examples 01 and 02 run against the default
`up` in test_up_real (one engine start for both). Minutes: slow.

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_examples_real.py
"""

from __future__ import annotations

import pytest
from example_runner import EXAMPLES, run_example

pytestmark = pytest.mark.slow
READY_TIMEOUT_S = 900


def test_03_sla_tenants_real(start_up):
    server = start_up(
        "--spec", str(EXAMPLES / "03-sla-tenants" / "tenants.yaml"), ready_timeout_s=READY_TIMEOUT_S
    )
    out = run_example("03-sla-tenants/sla_tenants.py", f"{server.url}/v1", "--requests", "4")
    assert "interactive" in out and "batch" in out and "server: deployment" in out

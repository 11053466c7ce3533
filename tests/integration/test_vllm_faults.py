"""A hung vLLM engine core with real replicas (tests/reliability/vllm_faults.py): two one-core CPU
replicas of the bundled model; one replica's engine-core process is stopped (SIGSTOP)
under 24 streams. vLLM's own health check reads only an error flag, so before the
step-progress check these streams hung until the client gave up; now the replica fails
its health checks, exits, and every stream finishes on the other replica with exactly its
uninterrupted float32 greedy tokens. The kill and drain faults run in
`python -m tests.reliability.run --only faults_vllm` (docs/reliability.md).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("vllm")
pytest.importorskip("ray.serve")

from tests.reliability import vllm_faults as faults  # noqa: E402


def test_a_hung_engine_core_is_replaced_and_its_streams_continue_token_for_token():
    outcome = faults.vllm_faults(faults=("hung",))
    hung = outcome.details["hung"]
    assert outcome.engine == "vllm"
    assert (outcome.requests, outcome.lost, outcome.errors_5xx) == (24, 0, 0), hung
    assert hung["ongoing_at_fault"][0] >= faults.FAULT_AT_ONGOING, hung
    assert hung["migrations"] >= 1 and hung["restarts"] >= 1, hung

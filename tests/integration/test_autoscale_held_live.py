"""Live: requests held in the ingress's deadline queue reach our SLA policy in a real local
Ray Serve deployment of the fake engine (serve/held_board.py through Ray's GCS store).

max_num_seqs 1: a replica takes 2 requests (one running, one queued in the engine); the
ingress holds the rest. With 5 clients, Ray's context alone sees 2 in flight and the policy
would add one replica at a time (1 -> 2); with the ingress's line it sees all 5 and sizes
the fleet for them at once: one replica per request (max_num_seqs x target_utilization
< 1), 1 -> 5 (4 when a client is between two requests at that moment), and no more while
they warm and take the line (max_replicas 8: a held line counted twice would show as more).
"""

from __future__ import annotations

import time

import pytest
from agentserve.serve.app import deployment_name
from agentserve.serve.held_board import HELD_SCOPE, HeldReport, read_held
from agentserve_bench.fake_engine import FakeEngineFactory
from test_autoscale_live import Load, live_spec, serving

SPEC = live_spec(
    max_num_seqs=1, max_replicas=8, downscale_delay_s=600,
    sla={"ttft_p95_ms": 60000, "tpot_p95_ms": 1000},
)  # fmt: skip
ENGINE = FakeEngineFactory(token_delay_s=0.03, per_seq_delay_s=0.0, accept_per_step=1)


@pytest.fixture(scope="module")
def served():
    yield from serving(SPEC, ENGINE)


def _replicas(serve) -> int:
    app = serve.status().applications["agentserve"]
    return sum(app.deployments[deployment_name("m")].replica_states.values())


def _published() -> list[HeldReport]:
    """The board as the policy reads it in the controller (Ray's GCS store, app named)."""
    from agentserve.serve.gcs_board import GcsHeldStore

    report = read_held(GcsHeldStore("agentserve"), HELD_SCOPE, "m")
    return [] if report is None else [report]


def test_the_line_at_the_ingress_sizes_the_fleet_in_one_step(served):
    assert _replicas(served) == 1
    seen: list[int] = []
    held_max = 0
    with Load(clients=5) as load:
        deadline = time.monotonic() + 60
        settle = None
        while time.monotonic() < deadline:
            held_max = max([held_max, *(r.held for r in _published())])
            n = _replicas(served)
            if not seen or seen[-1] != n:
                seen.append(n)
            if n > 1 and settle is None:
                settle = time.monotonic() + 8  # watch the warm-up: no second step
            if settle is not None and time.monotonic() > settle:
                break
            time.sleep(0.1)
    assert load.statuses and set(load.statuses) == {200}
    assert held_max >= 2, held_max  # 5 clients, 2 slots: the ingress held the rest
    # one step sized for the line (5 clients, one briefly between its requests: 4 or 5;
    # Ray's count alone: 2), and never more replicas than clients (no line counted twice)
    assert seen[0] == 1 and seen[1] >= 4 and max(seen) <= 5, seen

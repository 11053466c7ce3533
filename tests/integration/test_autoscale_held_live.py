"""Live: requests held in the ingress's deadline queue reach our SLA policy in a real local
Ray Serve deployment of the fake engine (serve/held_board.py through Ray's GCS store).

max_num_seqs 1: a replica takes 2 requests (one running, one queued in the engine); the
ingress holds the rest. With 8 clients, Ray's context alone sees 2 in flight and the policy
would add one replica at a time (1 -> 2); with the ingress's line it sees all 8 and sizes
the fleet for them at once (1 -> max_replicas 4, one replica per request at
max_num_seqs x target_utilization < 1).
"""

from __future__ import annotations

import time

import pytest
from agentserve.serve.app import build_app, deployment_name
from agentserve.serve.held_board import HeldReport
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngineFactory
from test_autoscale_live import Load

PORT = 8767  # the Load client's port (test_autoscale_live); modules run one at a time
SPEC = DeploymentSpec.model_validate(
    {
        "models": [
            {
                "name": "m",
                "engine": "fake",
                "max_model_len": 256,
                "max_num_seqs": 1,
                "replicas": {"min_replicas": 1, "max_replicas": 4, "num_cpus": 0.1},
            }
        ],
        "autoscaling": {
            "policy": "sla",
            "interval_s": 1,
            "upscale_delay_s": 2,
            "downscale_delay_s": 600,
            "look_back_period_s": 3,
            "open_mode_sla": {"ttft_p95_ms": 60000, "tpot_p95_ms": 1000},
        },
        "server": {"port": PORT},
    }
)
ENGINE = FakeEngineFactory(token_delay_s=0.03, per_seq_delay_s=0.0, accept_per_step=1)


@pytest.fixture(scope="module")
def served():
    ray = pytest.importorskip("ray")
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(SPEC, ENGINE), name="agentserve", route_prefix="/")
    yield serve
    serve.shutdown()
    ray.shutdown()


def _replicas(serve) -> int:
    app = serve.status().applications["agentserve"]
    return sum(app.deployments[deployment_name("m")].replica_states.values())


def _published() -> list[HeldReport]:
    from ray.experimental import internal_kv

    prefix = b"held/agentserve/requests/m/"
    keys = internal_kv._internal_kv_list(prefix, namespace="agentserve")
    raw = [internal_kv._internal_kv_get(k, namespace="agentserve") for k in keys]
    return [HeldReport.from_json(r) for r in raw if r is not None]


def test_the_line_at_the_ingress_sizes_the_fleet_in_one_step(served):
    assert _replicas(served) == 1
    seen: list[int] = []
    held_max = 0
    with Load(clients=8) as load:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            held_max = max([held_max, *(r.held for r in _published())])
            n = _replicas(served)
            if not seen or seen[-1] != n:
                seen.append(n)
            if n > 1:
                break
            time.sleep(0.1)
    assert load.statuses and set(load.statuses) == {200}
    assert held_max >= 4, held_max  # 8 clients, 2 slots: the ingress held the rest
    assert seen[:2] == [1, 4], seen  # one step to max_replicas, not 1 -> 2

"""Live: our SLA policy drives a real local Ray Serve deployment of the fake engine.

Load that breaks the TPOT objective scales the model 1 -> 2 replicas; idleness scales it
back to 1. The fake engine's step time grows with its batch (20 ms + 20 ms per running
sequence), so 4 concurrent requests on one replica give ~100 ms per output token against
a 50 ms SLO; no request queues anywhere (max_num_seqs 4), so the scale-up can only come
from the TPOT the replicas publish through record_autoscaling_stats.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from agentserve.autoscale.ray_policy import POLICY_PATH
from agentserve.serve.app import build_app, deployment_name, deployment_options
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngineFactory

PORT = 8767


def live_spec(
    *, max_num_seqs: int, max_replicas: int, downscale_delay_s: float, sla: dict
) -> DeploymentSpec:
    """One fake-engine model "m" (1 to `max_replicas` replicas) under the SLA policy,
    deciding every second on a 3 s look-back, in open mode with objectives `sla`."""
    replicas = {"min_replicas": 1, "max_replicas": max_replicas, "num_cpus": 0.1}
    model = {"name": "m", "engine": "fake", "max_model_len": 256, "max_num_seqs": max_num_seqs}
    autoscaling = {
        "policy": "sla",
        "interval_s": 1,
        "upscale_delay_s": 2,
        "downscale_delay_s": downscale_delay_s,
        "look_back_period_s": 3,
        "open_mode_sla": sla,
        "standby_replicas": 0,  # the scale-up under test, not a standby headroom
    }
    return DeploymentSpec.model_validate(
        {"models": [model | {"replicas": replicas}], "autoscaling": autoscaling,
         "server": {"port": PORT}}
    )  # fmt: skip


def serving(spec: DeploymentSpec, engine):
    """A module fixture's body: a local Ray Serve running `spec` on `engine` as app
    "agentserve"; yields `serve`, shuts everything down after."""
    ray = pytest.importorskip("ray")
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(spec, engine), name="agentserve", route_prefix="/")
    yield serve
    serve.shutdown()
    ray.shutdown()


SPEC = live_spec(
    max_num_seqs=4, max_replicas=2, downscale_delay_s=6,
    sla={"ttft_p95_ms": 2000, "tpot_p95_ms": 50},
)  # fmt: skip
ENGINE = FakeEngineFactory(token_delay_s=0.02, per_seq_delay_s=0.02, accept_per_step=1)


@pytest.fixture(scope="module")
def served():
    yield from serving(SPEC, ENGINE)


def _running(serve) -> int:
    app = serve.status().applications["agentserve"]
    states = app.deployments[deployment_name("m")].replica_states
    return int(states.get("RUNNING", 0))


def _wait_for(serve, replicas: int, timeout_s: float, timeline: list) -> float:
    """Seconds until `replicas` are RUNNING (fails after timeout_s)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        n = _running(serve)
        if not timeline or timeline[-1][1] != n:
            timeline.append((round(time.monotonic() - start, 1), n))
        if n == replicas:
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"not {replicas} replicas after {timeout_s} s: {timeline}")


class Load:
    """`clients` concurrent chat requests in a loop on a background thread until stop()."""

    def __init__(self, clients: int):
        self.clients, self.done = clients, threading.Event()
        self.statuses: list[int] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _client(self, http: httpx.AsyncClient) -> None:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": " ".join(["w"] * 24)}],
            "max_tokens": 24,
        }
        while not self.done.is_set():
            r = await http.post("/v1/chat/completions", json=body)
            self.statuses.append(r.status_code)

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as http:
            await asyncio.gather(*(self._client(http) for _ in range(self.clients)))

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=70)


def test_options_select_our_policy():
    config = deployment_options(SPEC.models[0], SPEC)["autoscaling_config"]
    assert config["policy"]["policy_function"] == POLICY_PATH
    assert config["metrics_interval_s"] == 1.0  # replicas push every second (look-back 3 s)


def test_tpot_breach_scales_up_and_idleness_scales_down(served):
    timeline: list = []
    assert _running(served) == 1
    with Load(clients=4) as load:
        up_s = _wait_for(served, 2, timeout_s=45, timeline=timeline)
        time.sleep(2)  # a little load on two replicas
    assert load.statuses and set(load.statuses) == {200}
    timeline.append(("load stopped", None))
    down_s = _wait_for(served, 1, timeout_s=60, timeline=timeline)
    print(f"scale-up after {up_s:.1f} s of load, scale-down {down_s:.1f} s after it; {timeline}")

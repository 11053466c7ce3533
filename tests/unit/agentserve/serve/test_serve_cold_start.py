"""Bounded cold-start hold at the ingress, with the fake engine behind a backend that, like
Serve's router at zero replicas, queues requests until a replica is ready."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine

LOCAL = "http://localhost"  # open mode answers only trusted Host names

MSG = [{"role": "user", "content": "wake up"}]


class ColdBackend(LocalBackend):
    """A model scaled to zero: no ready replica until `start_after_s` after the first
    request (None = never); requests wait for it, as in Serve's router."""

    def __init__(self, engine: FakeEngine, start_after_s: float | None):
        super().__init__(engine)
        self.start_after_s = start_after_s
        self.ready = asyncio.Event()
        self.cancelled = 0

    async def ready_replicas(self) -> int | None:
        return 1 if self.ready.is_set() else 0

    async def _start(self) -> None:
        if self.start_after_s is not None:
            await asyncio.sleep(self.start_after_s)
            await self.engine.start()
            self.ready.set()

    async def generate(self, request):
        asyncio.get_running_loop().create_task(self._start())
        try:
            await self.ready.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        async for delta in super().generate(request):
            yield delta


def _spec(hold_s: float) -> DeploymentSpec:
    return DeploymentSpec.model_validate(
        {
            "models": [
                {"name": "m", "engine": "fake", "replicas": {"min_replicas": 0, "max_replicas": 2}}
            ],
            "autoscaling": {"scale_to_zero_idle_s": 60, "cold_start_hold_timeout_s": hold_s},
        }
    )


async def _post(backend, hold_s: float, **extra) -> httpx.Response:
    app = create_app(_spec(hold_s), {"m": backend})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=LOCAL) as client:
        body = {"model": "m", "messages": MSG, **extra}
        return await client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("stream", [False, True])
def test_requests_are_held_while_the_first_replica_starts(stream):
    backend = ColdBackend(FakeEngine("m", 64), start_after_s=0.3)
    r = asyncio.run(_post(backend, hold_s=5.0, stream=stream))
    assert r.status_code == 200
    assert "wake" in r.text and "up" in r.text


def test_hold_is_bounded_then_503_with_retry_after():
    backend = ColdBackend(FakeEngine("m", 64), start_after_s=None)

    async def scenario():
        started = asyncio.get_running_loop().time()
        r = await _post(backend, hold_s=0.3)
        return r, asyncio.get_running_loop().time() - started

    r, waited = asyncio.run(scenario())
    assert r.status_code == 503 and r.headers["retry-after"] == "10"
    assert r.json()["error"]["code"] == "overloaded" and "starting" in r.json()["error"]["message"]
    assert 0.3 <= waited < 2.0
    assert backend.cancelled == 1  # the queued request was withdrawn


def test_warm_models_are_not_bounded_by_the_hold():
    engine = FakeEngine("m", 64, token_delay_s=0.2)
    asyncio.run(engine.start())
    r = asyncio.run(_post(LocalBackend(engine), hold_s=0.1))  # first token after 0.2 s
    assert r.status_code == 200

"""Issue 64 item 6: /status and /metrics are computed at most once per second for all
callers (serve/cached.py): a flood of scrapes costs one Serve controller call and one
stats call per model per second."""

from __future__ import annotations

import asyncio

from agentserve.serve import status
from agentserve.serve.backend import LocalBackend
from agentserve.serve.cached import Cached
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from fastapi import FastAPI
from fastapi.testclient import TestClient

LOCAL = {"base_url": "http://localhost", "client": ("127.0.0.1", 50000)}


def test_concurrent_callers_share_one_computation_and_it_expires():
    now, calls = [0.0], []

    async def compute() -> int:
        calls.append(1)
        await asyncio.sleep(0.01)
        return len(calls)

    cache = Cached(compute, ttl_s=1.0, clock=lambda: now[0])

    async def run() -> list[int]:
        return list(await asyncio.gather(*(cache.get() for _ in range(50))))

    assert asyncio.run(run()) == [1] * 50
    now[0] = 0.5
    assert asyncio.run(cache.get()) == 1
    now[0] = 1.5
    assert asyncio.run(cache.get()) == 2


def test_status_asks_the_controller_once_per_second(monkeypatch):
    calls = []
    monkeypatch.setattr(status, "current_status", lambda: calls.append(1) or {"applications": {}})
    app = FastAPI()
    status.add_status_route(app)
    client = TestClient(app, **LOCAL)
    for _ in range(20):
        assert client.get("/status").status_code == 200
    assert len(calls) == 1


class _CountingEngine(FakeEngine):
    stats_calls = 0

    async def stats(self):
        self.stats_calls += 1
        return await super().stats()


def test_metrics_ask_each_model_once_per_second():
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 256}]}
    )
    engine = _CountingEngine("m", 256)
    asyncio.run(engine.start())
    client = TestClient(create_app(spec, {"m": LocalBackend(engine)}), **LOCAL)
    for _ in range(20):
        r = client.get("/metrics")
        assert r.status_code == 200 and "agentserve_" in r.text
    assert engine.stats_calls == 1

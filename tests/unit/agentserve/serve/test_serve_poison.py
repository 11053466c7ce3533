"""Poison requests (serve/poison.py): a request under which two replicas died is failed
with a clear 400 instead of being replayed on a third, and the same request sent again is
refused at once; other requests are still served."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.serve.ingress import create_app
from agentserve.serve.migrate import migrating
from agentserve.serve.poison import PoisonList, PoisonRequestError
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from test_serve_migrate import MSG, Pool, _chat, _engines

LOCAL = "http://localhost"


def _crashing(n: int) -> list[FakeEngine]:
    engines = _engines(n)
    for e in engines:
        e.inject("crash", after_tokens=0)
    return engines


def test_second_death_fails_the_request_as_poison_and_spares_the_third_replica():
    a, b, c = _crashing(3)
    seen: list[int] = []
    poisoned: list[bool] = []
    stream = migrating(
        Pool(a, b, c).generate, _chat(max_tokens=8), 2, seen.append,
        on_poison=lambda: poisoned.append(True),
    )  # fmt: skip

    async def run():
        return [d async for d in stream]

    with pytest.raises(PoisonRequestError) as caught:
        asyncio.run(run())
    assert caught.value.status == 400 and caught.value.code == "request_crashed_engine"
    assert seen == [1] and poisoned == [True]
    assert len(c.requests) == 0, "no third replica is sacrificed"


def test_reaching_an_already_dead_replica_is_not_a_death_of_the_request():
    """A request whose replica died under it, then routed to a replica that was already
    going down (EngineGoneError: it ran nothing there), continues on a third: one death."""
    from agentserve.engine.protocol import EngineGoneError

    a, c = _engines(2)
    a.inject("crash", after_tokens=2)

    async def gone(request):
        raise EngineGoneError("the engine died before this request")
        yield  # an async generator, as a replica's stream is

    replicas = iter([a.generate, gone, c.generate])
    poisoned: list[bool] = []
    stream = migrating(
        lambda r: next(replicas)(r), _chat(max_tokens=8), 3, on_poison=lambda: poisoned.append(1)
    )

    async def run():
        return [d async for d in stream]

    deltas = asyncio.run(run())
    assert deltas and deltas[-1].finish_reason is not None
    assert poisoned == [], "arriving at a dead replica is not the request's fault"
    assert len(c.requests) == 1


def _client(*engines) -> TestClient:
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 256}]}
    )
    app = create_app(spec, {"m": Pool(*engines)})
    return TestClient(app, base_url=LOCAL, client=("127.0.0.1", 50000))


def test_ingress_answers_400_and_refuses_the_same_request_again_without_an_engine():
    a, b = _crashing(2)
    (healthy,) = _engines(1)
    client = _client(a, b, healthy)
    body = {"model": "m", "messages": MSG, "max_tokens": 8}
    first = client.post("/v1/chat/completions", json=body)
    assert first.status_code == 400, first.text
    assert first.json()["error"]["code"] == "request_crashed_engine"
    assert len(healthy.requests) == 0, "not replayed on the third replica"
    again = client.post("/v1/chat/completions", json=body | {"stream": True})
    assert again.status_code == 400 and again.json()["error"]["code"] == "request_crashed_engine"
    assert len(healthy.requests) == 0, "refused before reaching any replica"
    other = client.post("/v1/chat/completions", json=body | {"max_tokens": 7})
    assert other.status_code == 200 and len(healthy.requests) == 1


def test_poison_list_is_per_tenant_and_forgets():
    clock = [0.0]
    book = PoisonList(lambda: clock[0], remember_s=10.0)
    body = _chat(max_tokens=3).body
    book.add("t1", "chat", body)
    with pytest.raises(PoisonRequestError):
        book.check("t1", "chat", body)
    book.check("t2", "chat", body)  # another tenant's identical request is not refused
    book.check("t1", "completion", body)
    clock[0] = 11.0
    book.check("t1", "chat", body)  # forgotten

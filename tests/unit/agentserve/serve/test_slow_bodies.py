"""Slow request bodies (issue 64 item 3, fake engine): a body not sent whole within
server.body_read_timeout_s gets 408 request_timeout, and a tenant's requests not yet admitted
are capped at server.max_unadmitted_per_tenant (429 before the body is read) while another
tenant is served; places are given back however the request ends."""

from __future__ import annotations

import asyncio
import time

from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request

KEYS = {"a": "sk-slow-body-tenant-a", "b": "sk-slow-body-tenant-b"}
URL = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _app(*, keys: bool = True, timeout_s: float = 0.3, cap: int = 2):
    tenants = [
        {"name": name, "api_key_sha256": hash_api_key(key), "sla": {}} for name, key in KEYS.items()
    ]
    spec = DeploymentSpec.model_validate({
        "models": [{"name": "m", "engine": "fake", "max_model_len": 256}],
        "tenants": tenants if keys else [],
        "server": {"body_read_timeout_s": timeout_s, "max_unadmitted_per_tenant": cap},
    })  # fmt: skip
    engine = FakeEngine("m", 256)
    asyncio.run(engine.start())
    return create_app(spec, {"m": LocalBackend(engine)})


def _auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def test_spec_defaults():
    server = DeploymentSpec.model_validate({"models": [{"name": "m"}]}).server
    assert server.body_read_timeout_s == 30.0
    assert server.max_unadmitted_per_tenant == 16


def test_a_trickling_body_gets_408_at_the_deadline():
    app = _app(timeout_s=0.3)

    async def run():
        started = time.monotonic()
        slow = await asgi_request(app, "POST", URL, BODY, headers=_auth("a"), trickle_s=0.05)
        return (
            slow,
            time.monotonic() - started,
            await asgi_request(app, "POST", URL, BODY, headers=_auth("a")),
        )

    slow, took_s, quick = asyncio.run(run())
    assert slow.status == 408
    assert slow.json()["error"]["code"] == "request_timeout"
    assert "body_read_timeout_s" in slow.json()["error"]["message"]
    assert 0.25 < took_s < 2.0
    assert quick.status == 200, "the tenant's place was given back"
    assert app.state.ingress.unadmitted.counts == {}


def test_one_tenants_slow_bodies_are_capped_and_another_tenant_is_served():
    app = _app(timeout_s=1.0, cap=2)

    async def run():
        slow = [
            asyncio.ensure_future(
                asgi_request(app, "POST", URL, BODY, headers=_auth("a"), trickle_s=0.1)
            )
            for _ in range(2)
        ]
        await asyncio.sleep(0.2)  # both are sending their bodies
        held = dict(app.state.ingress.unadmitted.counts)
        third = await asgi_request(app, "POST", URL, BODY, headers=_auth("a"))
        other = await asgi_request(app, "POST", URL, BODY, headers=_auth("b"))
        ended = await asyncio.gather(*slow)
        after = await asgi_request(app, "POST", URL, BODY, headers=_auth("a"))
        return held, third, other, ended, after

    held, third, other, ended, after = asyncio.run(run())
    assert held == {"a": 2}
    assert third.status == 429
    assert third.json()["error"]["code"] == "too_many_unadmitted_requests"
    assert "Retry-After" in third.headers or "retry-after" in third.headers
    assert other.status == 200, "another tenant is not held up by a's slow bodies"
    assert [c.status for c in ended] == [408, 408]
    assert after.status == 200, "the places came back when the slow bodies timed out"
    assert app.state.ingress.unadmitted.counts == {}


def test_refused_requests_give_their_place_back():
    app = _app(cap=1)

    async def run():
        bad = await asgi_request(app, "POST", URL, b"{not json", headers=_auth("a"))
        good = await asgi_request(app, "POST", URL, BODY, headers=_auth("a"))
        return bad, good

    bad, good = asyncio.run(run())
    assert bad.status == 400
    assert good.status == 200
    assert app.state.ingress.unadmitted.counts == {}


def test_open_mode_has_the_deadline_but_no_cap():
    app = _app(keys=False, timeout_s=0.5, cap=1)

    async def run():
        slow = asyncio.ensure_future(asgi_request(app, "POST", URL, BODY, trickle_s=0.1))
        await asyncio.sleep(0.2)
        quick = await asgi_request(app, "POST", URL, BODY)
        return await slow, quick

    slow, quick = asyncio.run(run())
    assert quick.status == 200
    assert slow.status == 408


def _requests_counted(app, status: int) -> float:
    value = app.state.ingress.endpoints.metrics.registry.get_sample_value(
        "agentserve_requests_total", {"model": "m", "tenant": "a", "status": str(status)}
    )
    return value or 0.0


def test_a_stream_whose_client_stops_reading_is_ended_and_its_generation_aborted():
    """Item 7: a non-reading client. The path is not pulled while the client does not
    take its frame, and past server.stream_stall_timeout_s the stream ends, the engine
    request is aborted long before its 400 tokens are generated, and it counts 499."""
    tenants = [{"name": "a", "api_key_sha256": hash_api_key(KEYS["a"]), "sla": {}}]
    spec = DeploymentSpec.model_validate({
        "models": [{"name": "m", "engine": "fake", "max_model_len": 1024}],
        "tenants": tenants,
        "server": {"stream_stall_timeout_s": 0.3},
    })  # fmt: skip
    engine = FakeEngine("m", 1024, token_delay_s=0.01, accept_per_step=1)  # 400 tokens: 4 s
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})
    body = {**BODY, "max_tokens": 400, "stream": True, "ignore_eos": True}

    async def run():
        started = time.monotonic()
        reading = asgi_request(app, "POST", URL, body, headers=_auth("a"), reads=2)
        call = await asyncio.wait_for(reading, 5.0)  # without the guard: waits for ever
        return call, time.monotonic() - started

    call, took_s = asyncio.run(run())
    assert call.status == 200
    assert len(call.body_times()) == 2, "the client took two frames, then nothing"
    assert took_s < 2.0, "ended at the stall limit, not when generation finished"
    (request,) = engine.requests
    assert request.request_id in engine.aborted, "the generation was aborted"
    assert _requests_counted(app, 499) == 1 and _requests_counted(app, 200) == 0


def test_spec_default_stall_timeout():
    server = DeploymentSpec.model_validate({"models": [{"name": "m"}]}).server
    assert server.stream_stall_timeout_s == 60.0

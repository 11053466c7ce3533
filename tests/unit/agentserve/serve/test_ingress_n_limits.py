"""A request's n counts n times against its tenant's max_concurrent_requests (each choice
is an engine sequence): n over the limit is a 400 naming `n`, and n that does not fit
next to the tenant's other requests in flight is a 429."""

from __future__ import annotations

import asyncio

from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import Call, asgi_request

URL, KEY = "/v1/chat/completions", "sk-tenant-n-0123"


def _app():
    tenant = {
        "name": "t",
        "api_key_sha256": hash_api_key(KEY),
        "sla": {},
        "rate_limit": {"max_concurrent_requests": 3},
    }
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 256}], "tenants": [tenant]}
    )
    engine = FakeEngine("m", 256, token_delay_s=0.02)
    asyncio.run(engine.start())
    return create_app(spec, {"m": LocalBackend(engine)})


def test_n_counts_against_max_concurrent_requests():
    app = _app()
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "w " * 20}], "max_tokens": 20}

    async def run():
        too_many = await asgi_request(app, "POST", URL, {**body, "n": 4}, headers=headers)
        assert too_many.status == 400, too_many.text()
        error = too_many.json()["error"]
        assert error["param"] == "n" and error["code"] == "concurrency_limit_exceeded"
        call = Call()
        running = asyncio.ensure_future(
            asgi_request(
                app, "POST", URL, {**body, "n": 2, "stream": True}, headers=headers, call=call
            )
        )
        while not call.body_times():
            await asyncio.sleep(0.005)
        beside = await asgi_request(app, "POST", URL, {**body, "n": 2}, headers=headers)
        assert beside.status == 429, "2 + 2 choices in flight is over the limit of 3"
        one = await asgi_request(app, "POST", URL, {**body, "n": 1}, headers=headers)
        assert one.status == 200, one.text()
        assert (await running).status == 200

    asyncio.run(run())

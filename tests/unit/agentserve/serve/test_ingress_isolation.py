"""One tenant cannot stall or observe another at the ingress (fake engine): heavy tool
schemas are capped and validated off the event loop, so a stream next to a hostile
request keeps its pace; the prefix-cache salt comes from the tenant, never the client."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest
from agentserve.admission.parsing import RequestParser
from agentserve.api.errors import InvalidRequestError, OverloadedError
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import Call, asgi_request

URL = "/v1/chat/completions"
MAX_GAP_S = 0.100  # the bound on a stream's inter-token gap


def _tool(i: int, properties: int = 30) -> dict:
    """A tool whose parameter schema takes milliseconds to meta-validate."""
    props = {
        f"p{j}": {"type": "string", "description": "x" * 20, "enum": [f"v{k}" for k in range(5)]}
        for j in range(properties)
    }
    parameters = {"type": "object", "properties": props, "title": f"tool {i}"}
    return {"type": "function", "function": {"name": f"t{i}", "parameters": parameters}}


def _app(engine: FakeEngine, spec: DeploymentSpec | None = None):
    spec = spec or DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 1024}]}
    )
    return create_app(spec, {"m": LocalBackend(engine)})


async def _stream_beside(app, hostile: list[dict]) -> tuple[list[float], list]:
    """Start a ~1.5 s stream; once it is flowing, send the hostile requests. Returns the
    stream's gaps between events after the first hostile request, and the hostile calls."""
    body = {"model": "m", "messages": [{"role": "user", "content": "w " * 150}]}
    call = Call()
    stream = asyncio.ensure_future(
        asgi_request(app, "POST", URL, {**body, "stream": True, "max_tokens": 150}, call=call)
    )
    while len(call.body_times()) < 3:
        await asyncio.sleep(0.005)
    started = time.monotonic()
    calls = await asyncio.gather(*(asgi_request(app, "POST", URL, h) for h in hostile))
    await stream
    times = [t for t in call.body_times() if t >= started - MAX_GAP_S]
    return [b - a for a, b in itertools.pairwise(times)], calls


def test_hostile_tool_schemas_do_not_stall_a_stream():
    engine = FakeEngine("m", 1024, token_delay_s=0.01, accept_per_step=1)
    asyncio.run(engine.start())
    app = _app(engine)
    heavy = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    too_many = {**heavy, "tools": [_tool(i, 1) for i in range(200)]}  # cap: 128
    distinct = {**heavy, "tools": [_tool(i) for i in range(40)]}  # ~130 KB, ~0.5 s to check
    gaps, (refused, served) = asyncio.run(_stream_beside(app, [too_many, distinct]))
    assert len(gaps) > 50, "the stream ran alongside the hostile requests"
    assert max(gaps) < MAX_GAP_S, f"stream stalled {max(gaps) * 1000:.0f} ms"
    assert refused.status == 400
    assert refused.json()["error"]["param"] == "tools"
    assert refused.json()["error"]["code"] == "too_many_tools"
    assert served.status == 200, served.text()


def _parse(parser: RequestParser, body: dict):
    return asyncio.run(parser.parse("chat", json.dumps(body).encode()))


def test_schemas_are_capped_cached_and_time_limited():
    parser = RequestParser({"m": 1024})
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    tools = {**base, "tools": [_tool(i) for i in range(5)]}
    _parse(parser, tools)
    cache = parser.cache("default")  # the open tenant's partition
    misses = cache.misses
    _parse(parser, tools)
    assert (cache.misses, cache.hits) == (misses, 5), "checked once"
    huge = {**base, "tools": [_tool(i, 2000) for i in range(2)]}  # ~2 x 140 KB
    with pytest.raises(InvalidRequestError) as err:
        _parse(parser, huge)
    assert err.value.code == "schemas_too_large"
    slow = RequestParser({"m": 1024}, timeout_s=0.0)
    with pytest.raises((InvalidRequestError, OverloadedError)) as err:
        _parse(slow, {**base, "tools": [_tool(i) for i in range(3)]})
    assert err.value.status in (400, 503), "past the limit: refused, not served"


def test_cache_salt_comes_from_the_tenant_not_the_client():
    keys = {"a": "sk-tenant-a-key", "b": "sk-tenant-b-key"}
    tenants = [{"name": n, "api_key_sha256": hash_api_key(k), "sla": {}} for n, k in keys.items()]
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 256}], "tenants": tenants}
    )
    engine = FakeEngine("m", 256)
    asyncio.run(engine.start())
    app = _app(engine, spec)
    body = {"model": "m", "messages": [{"role": "user", "content": "same prompt"}]}

    def salt_seen(tenant: str, **extra) -> str | None:
        headers = {"authorization": f"Bearer {keys[tenant]}"}
        call = asyncio.run(asgi_request(app, "POST", URL, {**body, **extra}, headers=headers))
        assert call.status == 200, call.text()
        return engine.requests[-1].body.cache_salt

    a = salt_seen("a")
    assert a is not None and len(a) >= 43, "every request is salted"
    assert salt_seen("a") == a, "a tenant keeps its cache across requests"
    assert salt_seen("b") != a, "tenants never share cached prefixes"
    assert salt_seen("b", cache_salt=a) != a, "B cannot claim A's salt"
    own = salt_seen("a", cache_salt="per-user-7")
    assert own not in (a, "per-user-7"), "a client salt splits its tenant's cache further"
    assert salt_seen("a", cache_salt="per-user-7") == own

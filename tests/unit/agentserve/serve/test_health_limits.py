"""Issue 30 item 5: GET /health (no key) makes at most one Serve call per model per
second, shared by concurrent callers, and clients sending no credentials are rate-limited
per address (serve/health.py)."""

from __future__ import annotations

import asyncio

from agentserve.serve.backend import LocalBackend
from agentserve.serve.health import UNAUTH_BURST, HealthCache, UnauthenticatedLimit
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request

KEY = "sk-health-test-key"


class _Counting(LocalBackend):
    """A backend whose health calls are counted and take a little while (a Serve call)."""

    def __init__(self, engine: FakeEngine):
        super().__init__(engine)
        self.calls = 0

    async def health(self) -> None:
        self.calls += 1
        await asyncio.sleep(0.01)
        await super().health()


def _app(keys: bool = False):
    tenants = [{"name": "a", "api_key_sha256": hash_api_key(KEY), "sla": {}}] if keys else []
    spec = DeploymentSpec.model_validate(
        {
            "models": [
                {"name": "m", "engine": "fake", "max_model_len": 64},
                {"name": "n", "engine": "fake", "max_model_len": 64},
            ],
            "tenants": tenants,
        }
    )
    backends = {name: _Counting(FakeEngine(name, 64)) for name in ("m", "n")}
    for backend in backends.values():
        asyncio.run(backend.engine.start())
    return create_app(spec, backends), backends


def test_a_health_flood_makes_one_serve_call_per_model():
    app, backends = _app()

    async def flood():
        return await asyncio.gather(*(asgi_request(app, "GET", "/health") for _ in range(30)))

    calls = asyncio.run(flood())
    assert [c.status for c in calls] == [200] * 30
    assert all(c.json()["models"] == {"m": "ok", "n": "ok"} for c in calls)
    assert [b.calls for b in backends.values()] == [1, 1]  # was 30 each


def test_the_cached_answer_expires_after_its_ttl():
    now = [100.0]
    backend = _Counting(FakeEngine("m", 64))
    asyncio.run(backend.engine.start())
    cache = HealthCache({"m": backend}, clock=lambda: now[0], ttl_s=1.0)

    async def ask():
        return await cache.answer()

    assert asyncio.run(ask())[0] == 200
    backend.engine.healthy = False
    now[0] += 0.5
    assert asyncio.run(ask())[0] == 200 and backend.calls == 1  # still fresh
    now[0] += 0.6
    status, body = asyncio.run(ask())
    assert status == 503 and body["models"] == {"m": "unavailable"} and backend.calls == 2


def test_unauthenticated_health_is_rate_limited_per_client():
    app, _ = _app()

    async def burst():
        return [(await asgi_request(app, "GET", "/health")) for _ in range(int(UNAUTH_BURST) + 5)]

    calls = asyncio.run(burst())
    statuses = [c.status for c in calls]
    assert statuses.count(200) >= UNAUTH_BURST - 1 and statuses[-1] == 429
    refused = calls[-1]
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"


def test_the_limit_counts_per_address_refills_and_spares_keyed_requests():
    now = [0.0]
    limit = UnauthenticatedLimit(None, keys_required=lambda: True, rate_per_s=2, burst=3,
                                 clock=lambda: now[0])  # fmt: skip
    assert [limit.allow("10.0.0.1") for _ in range(4)] == [True, True, True, False]
    assert limit.allow("10.0.0.2")  # another client has its own bucket
    now[0] += 0.5  # refills one token at 2/s
    assert limit.allow("10.0.0.1") and not limit.allow("10.0.0.1")
    keyed = {"path": "/v1/models", "headers": [(b"authorization", b"Bearer x")]}
    bare = {"path": "/v1/models", "headers": []}
    assert not limit.unauthenticated(keyed) and limit.unauthenticated(bare)
    assert limit.unauthenticated({"path": "/health", "headers": keyed["headers"]})
    open_mode = UnauthenticatedLimit(None, keys_required=lambda: False)
    assert not open_mode.unauthenticated(bare)


def test_requests_without_a_key_are_limited_when_keys_are_required():
    app, _ = _app(keys=True)

    async def burst():
        out = []
        for _ in range(int(UNAUTH_BURST) + 5):
            out.append(await asgi_request(app, "GET", "/v1/models"))
        keyed = await asgi_request(
            app, "GET", "/v1/models", headers={"authorization": f"Bearer {KEY}"}
        )
        return out, keyed

    calls, keyed = asyncio.run(burst())
    assert {c.status for c in calls[:10]} == {401} and calls[-1].status == 429
    assert keyed.status == 200  # a request with a key is never limited here

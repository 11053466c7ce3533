"""Token reservation and fair share at admission (fake engine): concurrent requests cannot
overspend tokens_per_minute together, and with several tenants and no limits one tenant
cannot take the whole model queue."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.admission.quota import RateLimiter
from agentserve.admission.shares import QueueShares, token_reservation
from agentserve.api.ask import ask_of
from agentserve.api.auth import TenantResolver
from agentserve.api.errors import InvalidRequestError, OverloadedError, RateLimitError
from agentserve.api.openai import parse_request
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request

KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-0123456789", "gamma": "sk-gamma-012345"}
URL = "/v1/chat/completions"


def _spec(limits=None, tenants=("alpha", "beta"), max_num_seqs=4, queue=64):
    return DeploymentSpec.model_validate(
        {
            "models": [
                {"name": "m", "engine": "fake", "max_model_len": 256, "max_num_seqs": max_num_seqs}
            ],
            "server": {"max_queue_len": queue},
            "tenants": [
                {
                    "name": t,
                    "api_key_sha256": hash_api_key(KEYS[t]),
                    "sla": {},
                    "rate_limit": (limits or {}) if t == "alpha" else {},
                }
                for t in tenants
            ],
        }
    )


def _body(words="hi there", max_tokens=20, **extra):
    return {"model": "m", "messages": [{"role": "user", "content": words}],
            "max_tokens": max_tokens, **extra}  # fmt: skip


async def _burst(spec, requests, token_delay_s=0.05):
    engine = FakeEngine("m", 256, token_delay_s=token_delay_s, accept_per_step=1)
    await engine.start()
    app = create_app(spec, {"m": LocalBackend(engine)})
    calls = [
        asgi_request(app, "POST", URL, body, headers={"authorization": f"Bearer {KEYS[who]}"})
        for who, body in requests
    ]
    return await asyncio.gather(*calls)


def test_concurrent_requests_cannot_overspend_tokens_per_minute():
    """6 at once at a 50-token limit: before reservations all 6 ran (132 tokens)."""
    spec = _spec({"tokens_per_minute": 50})
    calls = asyncio.run(_burst(spec, [("alpha", _body())] * 6))
    ok = [c for c in calls if c.status == 200]
    refused = [c for c in calls if c.status == 429]
    assert len(ok) + len(refused) == 6 and ok and refused
    used = sum(c.json()["usage"]["total_tokens"] for c in ok)
    assert used <= 50, used
    for c in refused:
        assert c.json()["error"]["code"] == "tokens_limit_exceeded"
        assert set(c.json()["error"]) == {"message", "type", "param", "code"}
        assert int(c.headers["retry-after"]) >= 1


def test_reservation_settles_to_actual_usage():
    """The unused part of a reservation is given back when the request ends."""
    clock = [0.0]
    limiter = RateLimiter(lambda: clock[0])
    tenant = TenantResolver(_spec({"tokens_per_minute": 100})).resolve(f"Bearer {KEYS['alpha']}")
    lease = limiter.admit(tenant, 60)
    with pytest.raises(RateLimitError, match="60 reserved"):
        limiter.admit(tenant, 60)
    lease.finish(10)  # used 10 of the 60 reserved
    limiter.admit(tenant, 60).finish(60)  # 10 + 60 <= 100
    with pytest.raises(RateLimitError) as err:
        limiter.admit(tenant, 60)  # 70 charged + 60 > 100
    assert err.value.headers()["Retry-After"] == "60"  # the first charge leaving is not enough
    clock[0] = 61.0
    limiter.admit(tenant, 60)


def test_a_request_larger_than_the_whole_budget_is_a_400_saying_to_lower_max_tokens():
    """It can never fit: a 429 would have clients retry it (the OpenAI SDK twice, after
    Retry-After), so it is a 400 naming max_tokens."""
    tenant = TenantResolver(_spec({"tokens_per_minute": 50})).resolve(f"Bearer {KEYS['alpha']}")
    with pytest.raises(InvalidRequestError, match="smaller max_tokens") as err:
        RateLimiter().admit(tenant, 51)
    assert (err.value.status, err.value.code) == (400, "tokens_limit_exceeded")
    assert err.value.param == "max_tokens" and not err.value.headers()


@pytest.mark.parametrize(
    ("body", "low", "high"),
    [
        (_body("hi there", 20), 22, 30),  # prompt estimate + max_tokens
        (_body("hi there", None), 256, 256),  # no max_tokens: the whole context
        ({"model": "m", "prompt": "one two three four five six", "max_tokens": 5}, 11, 14),
        ({"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}, 8, 8),  # token ids: exact
    ],
)
def test_token_reservation(body, low, high):
    body = {k: v for k, v in body.items() if v is not None}
    kind = "completion" if "prompt" in body else "chat"
    assert low <= token_reservation(ask_of(kind, parse_request(kind, body)), 256) <= high


def _tenants(*names, **limits):
    resolver = TenantResolver(_spec(limits, tenants=names))
    return {n: resolver.resolve(f"Bearer {KEYS[n]}") for n in names}


def test_fair_share_table():
    t = _tenants("alpha", "beta")
    shares = QueueShares({"m": 5}, queue_len=4)  # guarantee 4 // 2 = 2 each
    shares.set_tenants(list(t.values()))
    admitted = 0
    with pytest.raises(RateLimitError) as err:
        for _ in range(6):
            shares.admit("m", t["alpha"])
            admitted += 1
    assert admitted == 3 and err.value.code == "fair_share_exceeded"  # 5 - beta's 2
    shares.admit("m", t["beta"])
    shares.admit("m", t["beta"])
    with pytest.raises(OverloadedError):
        shares.admit("m", t["beta"])  # the model is full
    shares.release("m", "alpha")
    shares.admit("m", t["beta"])  # beta may borrow the freed place: alpha holds its share
    alone = QueueShares({"m": 5}, queue_len=4)
    alone.set_tenants([t["alpha"]])
    for _ in range(5):
        alone.admit("m", t["alpha"])  # one tenant: the whole queue


def test_one_tenant_without_limits_cannot_take_the_whole_queue():
    """alpha sends 12 at once to a model holding 1 running + 4 queued; beta's 2 later
    requests are still admitted (before fair share: alpha took all 5, beta got 503)."""
    spec = _spec(tenants=("alpha", "beta"), max_num_seqs=1, queue=4)

    async def scenario():
        engine = FakeEngine("m", 256, token_delay_s=0.05, accept_per_step=1)
        await engine.start()
        app = create_app(spec, {"m": LocalBackend(engine)})

        def send(who):
            auth = {"authorization": f"Bearer {KEYS[who]}"}
            return asyncio.ensure_future(asgi_request(app, "POST", URL, _body(), headers=auth))

        flood = [send("alpha") for _ in range(12)]
        await asyncio.sleep(0.05)
        later = [send("beta") for _ in range(2)]
        return await asyncio.gather(*flood), await asyncio.gather(*later)

    flood, later = asyncio.run(scenario())
    assert [c.status for c in later] == [200, 200]
    codes = [c.json()["error"]["code"] for c in flood if c.status == 429]
    assert sum(c.status == 200 for c in flood) == 3 and codes == ["fair_share_exceeded"] * 9

"""Tenant limits shared by ingress replicas (serve/shared_limits.py): through a keeper
handle (a fake one here, a Serve deployment in tests/integration/test_ingress_replicas.py)
the limits hold for all replicas together; with the keeper down each replica applies its
share alone; unlimited tenants never call the keeper."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from agentserve.admission import shared_limits
from agentserve.admission.shared_limits import KEEPER_RETRY_S, QuotaKeeper, SharedQuota
from agentserve.api.auth import TenantResolver
from agentserve.api.errors import RateLimitError
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.tenants import serve_in_thread

SECRET, OTHER = "sk-limited-0123456789", "sk-unlimited-0123456789"
URL = "/v1/chat/completions"


class FakeKeeperHandle:
    """Looks like a Serve handle to a QuotaKeeper: `handle.admit.remote(...)` is awaitable."""

    def __init__(self, keeper: QuotaKeeper):
        self.keeper, self.down, self.calls = keeper, False, []

    def __getattr__(self, method):
        handle = self

        class _Method:
            @staticmethod
            async def remote(*args):
                handle.calls.append(method)
                if handle.down:
                    raise ConnectionError("keeper unreachable")
                return await getattr(handle.keeper, method)(*args)

        return _Method


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def _spec(**limits) -> DeploymentSpec:
    tenants = [
        {"name": "alpha", "api_key_sha256": hash_api_key(SECRET), "sla": {}, "rate_limit": limits},
        {"name": "beta", "api_key_sha256": hash_api_key(OTHER), "sla": {}},
    ]
    model = {"name": "m", "engine": "fake", "max_model_len": 64}
    return DeploymentSpec.model_validate(
        {"models": [model], "tenants": tenants, "server": {"ingress_replicas": 2}}
    )


def _tenant(spec, key=SECRET):
    return TenantResolver(spec).resolve(f"Bearer {key}")


def test_two_ingress_apps_share_one_concurrency_limit_over_http():
    spec, handle = _spec(max_concurrent_requests=1), FakeKeeperHandle(QuotaKeeper(recover_s=0))
    apps = []
    for _ in range(2):
        engine = FakeEngine("m", 64, token_delay_s=0.1)
        asyncio.run(engine.start())
        apps.append(create_app(spec, {"m": LocalBackend(engine)}, quota=SharedQuota(handle, 2)))
    long = {"model": "m", "messages": [{"role": "user", "content": "w " * 30}], "max_tokens": 31}
    short = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    auth = {"authorization": f"Bearer {SECRET}"}
    with (
        serve_in_thread(apps[0]) as a,
        serve_in_thread(apps[1]) as b,
        httpx.Client(trust_env=False) as http,
    ):
        with http.stream("POST", a + URL, json=long | {"stream": True}, headers=auth) as s:
            lines = s.iter_lines()
            next(lines)  # alpha's one request is in flight on ingress A
            refused = http.post(b + URL, json=short, headers=auth)
            other = http.post(b + URL, json=short, headers={"authorization": f"Bearer {OTHER}"})
            assert [line for line in lines if line][-1] == "data: [DONE]"
        for _ in range(50):  # A sends the finish without waiting for it
            if handle.keeper.book.open_leases() == 0:
                break
            asyncio.run(asyncio.sleep(0.02))
        after = http.post(b + URL, json=short, headers=auth)
    assert refused.status_code == 429, "the limit is alpha's, on both ingress replicas"
    assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
    assert refused.headers["retry-after"] == "1"
    assert other.status_code == 200 and after.status_code == 200
    assert handle.calls.count("admit") == 3, "beta (no limits) never calls the keeper"


def test_keeper_down_applies_this_replicas_share_then_tries_again():
    spec, clock = _spec(max_concurrent_requests=4), Clock()
    handle = FakeKeeperHandle(QuotaKeeper(recover_s=0))
    quota = SharedQuota(handle, 2, clock=clock)
    tenant = _tenant(spec)

    async def run():
        handle.down = True
        held = [await quota.admit(tenant), await quota.admit(tenant)]  # 4 / 2 replicas
        with pytest.raises(RateLimitError):
            await quota.admit(tenant)
        # down: one admit call, then none until the retry time (syncs keep trying)
        assert handle.calls.count("admit") == 1
        handle.down, clock.now = False, KEEPER_RETRY_S
        shared = await quota.admit(tenant)  # the keeper again, with the whole limit
        assert handle.calls.count("admit") == 2
        await quota.drain()
        # the two leases admitted alone were adopted by the keeper at the next sync
        assert handle.keeper.book.open_leases() == 3
        shared.finish(3)
        shared.finish(3)  # once only
        for lease in held:
            lease.finish(0)
        await quota.drain()
        assert handle.keeper.book.open_leases() == 0

    asyncio.run(run())


def test_replicas_renew_their_leases(monkeypatch):
    monkeypatch.setattr(shared_limits, "RENEW_S", 0.01)
    spec, handle = _spec(max_concurrent_requests=4), FakeKeeperHandle(QuotaKeeper(recover_s=0))
    quota = SharedQuota(handle, 2)

    async def run():
        await quota.admit(_tenant(spec))
        for _ in range(200):  # about 0.1 s unloaded; a loaded machine may take longer
            if handle.calls.count("sync") >= 3:
                break
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert handle.calls.count("sync") >= 3


class SlowKeeperHandle(FakeKeeperHandle):
    """Each call takes 20 ms, as a Serve call does; records every call's batch size."""

    def __init__(self, keeper):
        super().__init__(keeper)
        self.sizes = []

    def __getattr__(self, method):
        inner = super().__getattr__(method)
        handle = self

        class _Method:
            @staticmethod
            async def remote(owner, *args):
                await asyncio.sleep(0.02)
                handle.sizes.append((method, len(args[0]) if args else 0))
                return await inner.remote(owner, *args)

        return _Method


def test_admissions_at_once_share_keeper_calls_and_a_lost_waiters_lease_is_returned():
    handle = SlowKeeperHandle(QuotaKeeper(recover_s=0))
    quota, tenant = SharedQuota(handle, 2), _tenant(_spec(max_concurrent_requests=100))

    async def run():
        leases = await asyncio.gather(*(quota.admit(tenant) for _ in range(16)))
        admits = [n for m, n in handle.sizes if m == "admit"]
        assert sum(admits) == 16 and len(admits) <= 2, admits  # group commit
        for lease in leases:
            lease.finish(1)
        waiter = asyncio.ensure_future(quota.admit(tenant))
        await asyncio.sleep(0.005)  # its admit call is in flight
        waiter.cancel()  # the client went away
        await asyncio.sleep(0.1)
        assert handle.keeper.book.open_leases() == 0, "the unwanted lease was given back"
        finishes = [n for m, n in handle.sizes if m == "sync" and n]
        assert sum(finishes) == 17 and len(finishes) <= 4, finishes

    asyncio.run(run())


class TimingOutKeeperHandle(FakeKeeperHandle):
    """The keeper grants the admission but its answer comes after the ingress gave up."""

    def __init__(self, keeper):
        super().__init__(keeper)
        self.granted = []

    def __getattr__(self, method):
        inner, handle = super().__getattr__(method), self

        class _Method:
            @staticmethod
            async def remote(*args):
                answer = await inner.remote(*args)
                if method == "admit":
                    handle.granted += [a for a in answer if a[0] == "lease"]
                    await asyncio.sleep(1)  # past ADMIT_TIMEOUT_S
                return answer

        return _Method


def test_an_admission_that_timed_out_here_but_reached_the_keeper_is_withdrawn(monkeypatch):
    monkeypatch.setattr(shared_limits, "ADMIT_TIMEOUT_S", 0.05)
    handle = TimingOutKeeperHandle(QuotaKeeper(recover_s=0))
    quota, tenant = SharedQuota(handle, 2), _tenant(_spec(max_concurrent_requests=2))

    async def run():
        lease = await quota.admit(tenant)  # timed out: this replica's share, alone
        await quota.drain()
        assert len(handle.granted) == 1, "the keeper granted it all the same"
        assert handle.calls[:2] == ["admit", "sync"]
        assert lease.lease_id in quota.open and len(quota.open) == 1
        lease.finish(0)
        await quota.drain()
        assert handle.keeper.book.open_leases() == 0, "withdrawn and finished: slot free"

    asyncio.run(run())

"""The tenant-limits keeper failing (serve/shared_limits.py): a finish lost to a stalled
keeper is retried until it lands, a restarted keeper rebuilds its book from the ingress
replicas' open leases, and while it is down each replica counts its own leases and the
others' last known ones, so a tenant overshoots its concurrency limit by at most one."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from agentserve.admission import shared_limits
from agentserve.admission.shared_limits import QuotaKeeper, SharedQuota
from agentserve.api.errors import RateLimitError
from test_shared_limits import FakeKeeperHandle, _spec, _tenant


async def _until(predicate, timeout_s: float = 3.0) -> bool:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


def test_a_finish_lost_to_an_unreachable_keeper_is_retried_until_it_lands():
    handle = FakeKeeperHandle(QuotaKeeper(recover_s=0))
    quota, tenant = SharedQuota(handle, 2), _tenant(_spec(max_concurrent_requests=1))

    async def run():
        lease = await quota.admit(tenant)
        handle.down = True
        lease.finish(7)
        assert await _until(lambda: quota._attempts >= 1), "a sync was tried (and failed)"
        assert handle.keeper.book.open_leases() == 1
        handle.down = False
        assert await _until(lambda: handle.keeper.book.open_leases() == 0), "retried"
        await quota.admit(tenant)  # the tenant's one slot is free again

    asyncio.run(run())


def test_a_restarted_keeper_rebuilds_its_book_from_the_open_leases(monkeypatch):
    monkeypatch.setattr(shared_limits, "RENEW_S", 0.02)
    handle = FakeKeeperHandle(QuotaKeeper(recover_s=0))
    a, b = SharedQuota(handle, 2, owner="a"), SharedQuota(handle, 2, owner="b")
    tenant = _tenant(_spec(max_concurrent_requests=3))

    async def run():
        held = [await a.admit(tenant), await a.admit(tenant), await b.admit(tenant)]
        handle.keeper = QuotaKeeper(recover_s=0)  # restarted: an empty book
        assert await _until(lambda: handle.keeper.book.open_leases() == 3), "adopted"
        with pytest.raises(RateLimitError):
            await b.admit(tenant)
        held[0].finish(1)
        assert await _until(lambda: handle.keeper.book.open_leases() == 2)
        await b.admit(tenant)

    asyncio.run(run())


def test_while_the_keeper_is_down_no_replica_exceeds_the_limit_by_more_than_one(monkeypatch):
    monkeypatch.setattr(shared_limits, "RENEW_S", 0.02)
    handle = FakeKeeperHandle(QuotaKeeper(recover_s=0))
    a, b = SharedQuota(handle, 2, owner="a"), SharedQuota(handle, 2, owner="b")
    tenant = _tenant(_spec(max_concurrent_requests=3))

    async def admitted(quota: SharedQuota, tries: int) -> list:
        leases = []
        for _ in range(tries):
            with contextlib.suppress(RateLimitError):
                leases.append(await quota.admit(tenant))
        return leases

    async def run():
        held = [await a.admit(tenant), await a.admit(tenant), await b.admit(tenant)]
        assert await _until(lambda: b.elsewhere.get("alpha") == 2 and a.elsewhere.get("alpha") == 1)
        handle.down = True
        more = await admitted(a, 3) + await admitted(b, 3)
        assert len(held) + len(more) <= 3 + 1, "at most one over the limit"
        held[0].finish(1)  # a's own count drops: it may admit again, alone
        assert len(await admitted(a, 1)) == 1

    asyncio.run(run())


def test_a_just_restarted_keeper_leaves_admission_to_the_ingresses_until_they_synced():
    clock = [0.0]
    keeper = QuotaKeeper(clock=lambda: clock[0])  # default recovery period
    handle = FakeKeeperHandle(keeper)
    quota, tenant = SharedQuota(handle, 2, owner="a"), _tenant(_spec(max_concurrent_requests=4))

    async def run():
        lease = await quota.admit(tenant)  # recovering: admitted alone (share 2)
        assert keeper.book.open_leases() == 0 and lease.lease_id in quota.open
        await quota.admit(tenant)
        with pytest.raises(RateLimitError):
            await quota.admit(tenant)
        clock[0] = shared_limits.RECOVER_S
        await quota.drain()
        quota._wake.set()  # a sync: the keeper adopts both leases
        assert await _until(lambda: keeper.book.open_leases() == 2)
        await quota.admit(tenant)  # through the keeper now, with the whole limit
        assert keeper.book.open_leases() == 3

    asyncio.run(run())


def test_a_restarted_keeper_gets_the_last_minutes_requests_and_tokens_back(monkeypatch):
    monkeypatch.setattr(shared_limits, "RENEW_S", 0.02)
    handle = FakeKeeperHandle(QuotaKeeper(recover_s=0))
    a, b = SharedQuota(handle, 2, owner="a"), SharedQuota(handle, 2, owner="b")
    tenant = _tenant(_spec(requests_per_minute=4, tokens_per_minute=1000))

    async def run():
        for _ in range(3):
            (await a.admit(tenant, reserve_tokens=100)).finish(300)  # 900 tokens charged
        await a.drain()
        handle.keeper = QuotaKeeper(recover_s=0)  # restarted: empty windows
        assert await _until(lambda: "a" in handle.keeper._seen and not a._send_history)
        await asyncio.sleep(0.05)  # a's history sync went through
        with pytest.raises(RateLimitError) as caught:
            await b.admit(tenant, reserve_tokens=200)  # 900 + 200 > 1000 tokens per minute
        assert caught.value.code == "tokens_limit_exceeded"
        await b.admit(tenant, reserve_tokens=50)  # the 4th request of the minute
        with pytest.raises(RateLimitError):
            await b.admit(tenant, reserve_tokens=1)  # a 5th: over 4 requests per minute

    asyncio.run(run())

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


async def _admitted(quota: SharedQuota, tenant, tries: int) -> list:
    """The leases of `tries` admissions, refused ones left out."""
    leases = []
    for _ in range(tries):
        with contextlib.suppress(RateLimitError):
            leases.append(await quota.admit(tenant))
    return leases


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

    async def run():
        held = [await a.admit(tenant), await a.admit(tenant), await b.admit(tenant)]
        assert await _until(lambda: b.elsewhere.get("alpha") == 2 and a.elsewhere.get("alpha") == 1)
        handle.down = True
        more = await _admitted(a, tenant, 3) + await _admitted(b, tenant, 3)
        assert len(held) + len(more) <= 3 + 1, "at most one over the limit"
        held[0].finish(1)  # a's own count drops: it may admit again, alone
        assert len(await _admitted(a, tenant, 1)) == 1

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


def test_a_keeper_whose_loop_stalled_leaves_admission_to_the_ingresses_while_they_sync():
    clock, loop = [0.0], [0.0]  # loop: real time, as the keeper watches it
    keeper = QuotaKeeper(clock=lambda: clock[0], loop_clock=lambda: loop[0])
    clock[0] = 10.0  # past the start's recovery
    tenant = _tenant(_spec(max_concurrent_requests=4))
    ask = [(tenant, 0, None, 1)]

    async def run():
        assert (await keeper.admit("a", ask))[0][0] == "lease"
        loop[0] += 0.3  # a busy loop, not a stall
        assert (await keeper.admit("a", ask))[0][0] == "lease"
        loop[0] += 3.0  # SIGSTOP 3 s: the ingresses' admissions timed out meanwhile
        assert await keeper.admit("a", ask) == [("recovering", None)]
        assert keeper.recoveries == 1
        clock[0] += shared_limits.RECOVER_S
        assert (await keeper.admit("a", ask))[0][0] == "lease"

    asyncio.run(run())


def test_an_ingress_that_admitted_alone_says_so_and_the_keeper_recovers_until_all_synced(
    monkeypatch,
):
    """The stall's other half: the keeper back, one ingress synced, the other's leases
    admitted alone not yet in its book. Before, the first ingress's next admissions went
    through the keeper against that book, and the tenant went two or three over."""
    monkeypatch.setattr(shared_limits, "RENEW_S", 0.02)
    clock = [0.0]
    keeper = QuotaKeeper(clock=lambda: clock[0], stall_s=None)
    clock[0] = 10.0  # past the start's recovery
    to_a, to_b = FakeKeeperHandle(keeper), FakeKeeperHandle(keeper)
    a, b = SharedQuota(to_a, 2, owner="a"), SharedQuota(to_b, 2, owner="b")
    tenant = _tenant(_spec(max_concurrent_requests=3))

    async def run():
        to_a.down = to_b.down = True
        await asyncio.sleep(0.05)  # nothing known of the others any more
        alone = await _admitted(a, tenant, 3) + await _admitted(b, tenant, 3)
        assert len(alone) == 4 and a._went_alone and b._went_alone  # each its share: 2
        to_a.down = False  # a reaches the keeper again, b not yet
        a._wake.set()
        assert await _until(lambda: not a._went_alone), "a synced and said it went alone"
        more = await _admitted(a, tenant, 3)  # b's two are not in the book yet
        assert len(alone) + len(more) <= 3 + 1, "at most one over the limit"
        assert keeper.recovering() and keeper.recoveries == 1
        to_b.down = False
        assert await _until(lambda: not b._went_alone)
        assert keeper.book.open_leases() == 4, "both ingresses' leases adopted"

    asyncio.run(run())

"""Tenant limits that hold across ingress replicas.

With `server.ingress_replicas` > 1 the app runs one QuotaKeeper deployment (one replica)
holding the admission/quota_book.QuotaBook, and every ingress replica admits the requests of
rate-limited tenants through it (SharedQuota): one Serve call at admission, and one
`sync` call per ingress at least every RENEW_S that carries the leases finished since
the last one and the list of the ingress's open leases. Calls are batched (group commit):
what arrives while a call is in flight goes in the next one, so 16 requests at once cost
about two calls, not 16. A lease granted to a request that went away while it waited is
given back, and so is one granted by a call that timed out here but reached the keeper
(the ingress names its leases and withdraws the names of a failed call).
Tenants without limits never call it. With one ingress replica the limits stay in its
memory (LocalQuota) and cost nothing.

Reliability: a finish (or withdrawal) stays pending here until a sync that carried it
succeeded, retried every FINISH_RETRY_S (finishing is idempotent in the book), so a
stalled or restarting keeper cannot hold a tenant's slot for minutes. A restarted keeper
adopts the open leases every sync lists, so its book is whole again at the first sync,
and asks each ingress it never heard of for its window of the last minute (requests and
charged tokens, from `mirror`) so requests_per_minute and tokens_per_minute survive it
too (admission/quota_book.py). Leases of an ingress that died are finished by the book after its
LEASE_TTL_S. A keeper that was stalled (its loop did not run for ADMIT_TIMEOUT_S: SIGSTOP, a long
pause, a starved CPU) or that hears from an ingress that admitted alone since its last
sync does what a restarted one does: it leaves admission to the ingresses for RECOVER_S,
while their syncs bring the leases they admitted alone into its book (a keeper resuming
from a stall used to admit against a book that lacked them: a tenant limited to 3 reached
6 in flight).

Failure: when the keeper cannot answer within CALL_TIMEOUT_S (stalled, restarting,
unreachable), an ingress admits alone, for KEEPER_RETRY_S or until a sync gets through:
each limit split over the ingress replicas (rounded up) against this ingress's own
requests (its leases through the keeper count: `mirror`), and concurrency also bounded
by what the other ingresses held at the last sync while that is at most RENEW_S old (then
they are assumed done: a stale count would lock the tenant out). A tenant then
overshoots its concurrency limit by at most what the rounding gives (one with two
replicas), unless requests of another ingress outlive that knowledge.

Ray-free: the keeper is a plain class Serve hosts (serve/app.py), the client takes any
handle whose methods return awaitables from `.remote(...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from agentserve.admission.quota import Lease, RateLimiter
from agentserve.admission.quota_book import (
    RENEW_S,
    Admission,
    has_limits,
    refusal_error,
    share_of,
)
from agentserve.admission.quota_keeper import ADMIT_TIMEOUT_S, RECOVER_S, QuotaKeeper
from agentserve.api.auth import Tenant
from agentserve.api.errors import RateLimitError

__all__ = [
    "CALL_TIMEOUT_S",
    "KEEPER_RETRY_S",
    "RECOVER_S",
    "LocalQuota",
    "QuotaKeeper",
    "SharedQuota",
]

CALL_TIMEOUT_S = 2.0
KEEPER_RETRY_S = 2.0  # at most the renewal period: a sync that succeeds ends it sooner
FINISH_RETRY_S = 0.25  # a sync that failed is tried again after this
log = logging.getLogger(__name__)


class LocalQuota:
    """Limits in this process only (one ingress replica)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.limiter = RateLimiter(clock)

    async def admit(self, tenant: Tenant, reserve_tokens: int = 0, count: int = 1) -> Lease:
        return self.limiter.admit(tenant, reserve_tokens, count)

    async def drain(self) -> None:
        """Nothing is ever pending here (SharedQuota.drain's counterpart)."""


class _SharedLease:
    """A lease of this ingress (through the keeper or admitted alone); `finish` queues
    its finish for the keeper (retried until a sync carried it) without waiting."""

    def __init__(self, quota: SharedQuota, lease_id: str, tenant: Tenant, mirror: Lease):
        self._quota, self.lease_id, self.tenant, self.mirror = quota, lease_id, tenant, mirror
        self.reserved, self.count = mirror.reserved, mirror.count
        self._open = True

    def finish(self, tokens: int) -> None:
        if self._open:
            self._open = False
            self.mirror.finish(tokens)
            self._quota._finished(self.lease_id, tokens)


class _Batches:
    """Group commit: items submitted while a keeper call is in flight go together in the
    next call, so N requests at once cost about two calls, not N. `submit` returns a
    future of the item's answer (`send(batch)` returns one answer per item, or None)."""

    def __init__(self, send: Callable[[list[Any]], Any], lost: Callable[[Any], None] | None = None):
        """`lost(answer)`: the answer of an item whose caller stopped waiting."""
        self._send, self._lost, self._waiting = send, lost, []
        self._sender: asyncio.Task | None = None

    def submit(self, item: Any) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._drain())
        return future

    async def drain(self) -> None:
        """Wait until every item submitted so far was sent."""
        while self._sender is not None and not self._sender.done():
            await asyncio.shield(self._sender)

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                answers = await self._send([item for item, _ in batch])
            except Exception as err:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            for i, (_, future) in enumerate(batch):
                answer = None if answers is None else answers[i]
                if not future.done():
                    future.set_result(answer)
                elif future.cancelled() and self._lost is not None:
                    self._lost(answer)


class SharedQuota:
    """An ingress replica's view of the keeper (see the module docstring)."""

    def __init__(
        self,
        keeper: Any,
        replicas: int,
        clock: Callable[[], float] = time.monotonic,
        owner: str | None = None,
    ):
        self.keeper, self.replicas, self.clock = keeper, replicas, clock
        self.owner = owner or uuid.uuid4().hex[:12]
        self.local = RateLimiter(clock)  # unlimited tenants
        self.mirror = RateLimiter(clock)  # this ingress's leases of limited tenants
        self.open: dict[str, _SharedLease] = {}
        self.pending: dict[str, int] = {}  # lease id -> tokens: finishes not yet synced
        self.elsewhere: dict[str, int] = {}  # tenant -> in flight via other ingresses
        self._elsewhere_at = float("-inf")  # when `elsewhere` was last heard
        self._keeper_down_until = float("-inf")
        self._syncing: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._attempts = 0  # sync calls made (drain waits for one)
        self._send_history = False  # the keeper asked for this ingress's window
        self._went_alone = False  # admitted alone (keeper down) since the last sync
        self._lease_ids = itertools.count()
        self.admits = _Batches(self._admit, lost=self._unwanted)

    async def admit(
        self, tenant: Tenant, reserve_tokens: int = 0, count: int = 1
    ) -> Lease | _SharedLease:
        if not has_limits(tenant):
            return self.local.admit(tenant, reserve_tokens, count)
        self._start_syncing()
        if self.clock() >= self._keeper_down_until:
            lease_id = self._new_id()
            try:
                kind, value = await self.admits.submit((tenant, reserve_tokens, lease_id, count))
            except Exception as err:  # the keeper stalled, restarting or unreachable
                self._keeper_down(err)
            else:
                if kind == "refused":
                    raise refusal_error(value)
                if kind == "recovering":  # its book is being rebuilt: admit alone
                    alone = self._admit_alone(tenant, reserve_tokens, count)
                    self._wake.set()  # and tell it at once (the next sync adopts it)
                    return self._hold(self._new_id(), tenant, alone)
                mirror = self.mirror.adopt(tenant, reserve_tokens, count)
                return self._hold(str(value), tenant, mirror)
        alone = self._admit_alone(tenant, reserve_tokens, count)
        self._went_alone = True  # the keeper's book lacks this: it recovers when told,
        self._wake.set()  # as soon as a sync gets through
        return self._hold(self._new_id(), tenant, alone)

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait until the admissions submitted so far were sent and the finishes pending
        now were synced: retried (a loaded keeper may time a sync out) for up to
        `timeout_s` (before this process's loop ends; benchmarks and tests)."""
        await self.admits.drain()
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            tried = self._attempts
            self._start_syncing()
            self._wake.set()
            while self._attempts == tried and time.monotonic() < deadline:
                await asyncio.sleep(0.005)

    def _new_id(self) -> str:
        return f"{self.owner}/{next(self._lease_ids)}"

    def _hold(self, lease_id: str, tenant: Tenant, mirror: Lease) -> _SharedLease:
        lease = _SharedLease(self, lease_id, tenant, mirror)
        self.open[lease_id] = lease
        return lease

    def _admit_alone(self, tenant: Tenant, reserve_tokens: int, count: int) -> Lease:
        """Admission while the keeper is down: this ingress's share of each limit, over
        its own requests; concurrency also within what the others held at the last sync."""
        alone = share_of(tenant, self.replicas)
        most = tenant.rate_limit.max_concurrent_requests
        if most:
            fresh = self.clock() - self._elsewhere_at <= RENEW_S
            others = self.elsewhere.get(tenant.name, 0) if fresh else 0
            room = min(alone.rate_limit.max_concurrent_requests, most - others)
            mine = self.mirror.in_flight(tenant.name)
            if mine + count > room:
                raise RateLimitError(
                    f"tenant {tenant.name!r}: {mine} requests in flight here and {others} "
                    f"elsewhere, limit {most} (the limits keeper is unavailable: this "
                    f"ingress admits up to {max(0, room)})",
                    code="concurrency_limit_exceeded",
                )
            limits = alone.rate_limit.model_copy(update={"max_concurrent_requests": None})
            alone = dataclasses.replace(alone, rate_limit=limits)
        return self.mirror.admit(alone, reserve_tokens, count)

    def _finished(self, lease_id: str, tokens: int) -> None:
        self.open.pop(lease_id, None)
        self._withdraw(lease_id, tokens)

    def _withdraw(self, lease_id: str, tokens: int = 0) -> None:
        """Queue the finish of `lease_id` (or the withdrawal of a name the keeper may
        have granted) for the next sync."""
        self.pending[lease_id] = tokens
        self._start_syncing()
        self._wake.set()

    async def _admit(self, batch: list[tuple[Tenant, int, str, int]]) -> list[Admission]:
        if self.clock() < self._keeper_down_until:  # queued behind a call that timed out
            raise ConnectionError("the tenant limits keeper did not answer")
        try:
            return await self._call("admit", self.owner, batch, timeout_s=ADMIT_TIMEOUT_S)
        except Exception as err:
            self._keeper_down(err)  # before the next batch is sent: it goes alone
            # it may have reached the keeper all the same: withdraw every lease it asked for
            for _, _, lease_id, _ in batch:
                self._withdraw(lease_id)
            raise

    def _unwanted(self, answer: Admission) -> None:
        """A lease granted to a request that went away while it waited: give it back."""
        kind, value = answer
        if kind == "lease":
            self._withdraw(str(value))

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
        # races the call's end, and the renewal loop then never stops
        async with asyncio.timeout(timeout_s or CALL_TIMEOUT_S):
            return await getattr(self.keeper, method).remote(*args)

    def _start_syncing(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._syncing is None or self._syncing.done():
            self._syncing = asyncio.ensure_future(self._sync_forever())

    async def _sync_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RENEW_S):
                    await self._wake.wait()
            self._wake.clear()
            if not await self._sync():
                await asyncio.sleep(FINISH_RETRY_S)
                if self.pending:
                    self._wake.set()

    async def _sync(self) -> bool:
        """One sync call: the pending finishes and the open leases; True when it got
        through (the finishes it carried are then done, the keeper is up)."""
        try:
            return await self._sync_once()
        finally:
            self._attempts += 1

    async def _sync_once(self) -> bool:
        finished = dict(self.pending)
        open_leases = [(i, x.tenant, x.reserved, x.count) for i, x in self.open.items()]
        history = self.mirror.history() if self._send_history else None
        went_alone = self._went_alone
        args = (self.owner, list(finished.items()), open_leases, history, went_alone)
        try:
            elsewhere, wants_history = await self._call("sync", *args)
        except Exception as err:
            log.warning("tenant limits keeper: sync failed (%d finishes pending): %r",
                        len(self.pending), err)  # fmt: skip
            self._keeper_down(err, quiet=True)
            return False
        for lease_id, tokens in finished.items():
            if self.pending.get(lease_id) == tokens:
                del self.pending[lease_id]
        if went_alone:
            self._went_alone = False
        if history is not None:
            self._send_history = False
        elif wants_history:  # a keeper that never heard of this ingress (it restarted)
            self._send_history = True
            self._wake.set()
        if elsewhere is not None:  # None: a recovering keeper, keep the last known
            self.elsewhere, self._elsewhere_at = dict(elsewhere), self.clock()
        self._keeper_down_until = float("-inf")  # it answered: admit through it again
        return True

    def _keeper_down(self, err: BaseException, quiet: bool = False) -> None:
        was_up = self.clock() >= self._keeper_down_until
        self._keeper_down_until = self.clock() + KEEPER_RETRY_S
        if was_up and not quiet:
            log.warning(
                "tenant limits keeper unavailable (%r): this ingress admits alone (1/%d of "
                "each limit) until it answers again", err, self.replicas,
            )  # fmt: skip

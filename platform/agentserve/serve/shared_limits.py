"""Tenant limits that hold across ingress replicas.

With `server.ingress_replicas` > 1 the app runs one QuotaKeeper deployment (one replica,
no CPU) holding the api/quota_book.QuotaBook, and every ingress replica admits the
requests of rate-limited tenants through it (SharedQuota): one Serve call at admission,
one fire-and-forget call when the request ends, one renewal per ingress every RENEW_S.
Calls are batched (group commit): what arrives while a call is in flight goes in the
next one, so 16 requests at once cost about two calls, not 16. A lease granted to a
request that went away while it waited is given back, and so is one granted by a call
that timed out here but reached the keeper (the ingress names its leases and withdraws
the names of a failed call: api/quota_book.py).
Tenants without limits never call it. With one ingress replica the limits stay in its
memory (LocalQuota) and cost nothing.

Failure: when the keeper cannot answer within CALL_TIMEOUT_S (restarting, unreachable),
an ingress applies its share of each limit alone (limit / ingress replicas, rounded up)
for KEEPER_RETRY_S, then tries the keeper again. The limits then hold per replica, not
exactly in all. A restarted keeper starts with an empty book (the requests of the last
minute are forgotten). Leases of an ingress that died are finished by the book after its
LEASE_TTL_S (api/quota_book.py).

Ray-free: the keeper is a plain class Serve hosts (serve/app.py), the client takes any
handle whose methods return awaitables from `.remote(...)`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from agentserve.api.auth import Tenant
from agentserve.api.quota import Lease, RateLimiter
from agentserve.api.quota_book import (
    DEFAULT_MAX_AGE_S,
    RENEW_S,
    Admission,
    QuotaBook,
    has_limits,
    refusal_error,
    share_of,
)

__all__ = ["CALL_TIMEOUT_S", "KEEPER_RETRY_S", "LocalQuota", "QuotaKeeper", "SharedQuota"]

CALL_TIMEOUT_S = 2.0
KEEPER_RETRY_S = 5.0
log = logging.getLogger(__name__)


class LocalQuota:
    """Limits in this process only (one ingress replica)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.limiter = RateLimiter(clock)

    async def admit(self, tenant: Tenant, reserve_tokens: int = 0) -> Lease:
        return self.limiter.admit(tenant, reserve_tokens)

    async def drain(self) -> None:
        """Nothing is ever pending here (SharedQuota.drain's counterpart)."""


class QuotaKeeper:
    """The Serve deployment holding the one QuotaBook (async methods: one at a time on
    its event loop, no locks needed)."""

    def __init__(self, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        self.book = QuotaBook(max_age_s=max_age_s)

    async def admit(
        self, owner: str, requests: list[tuple[Tenant, int, str]]
    ) -> list[Admission]:
        """Admit each (tenant, reserve_tokens, lease id) in order: one answer per request."""
        return [self.book.admit(owner, t, reserve, lease_id) for t, reserve, lease_id in requests]

    async def finish(self, owner: str, leases: list[tuple[str, int]]) -> None:
        """Finish each (lease id, tokens used)."""
        for lease_id, tokens in leases:
            self.book.finish(owner, lease_id, tokens)

    async def renew(self, owner: str) -> int:
        """Renew `owner`; the number of its open leases (for tests and logs)."""
        self.book.renew(owner)
        return self.book.open_leases(owner)

    async def state(self) -> dict[str, Any]:
        """The ingress replicas heard from, open leases, leases expired (for status)."""
        book = self.book
        return {"owners": book.owners(), "open": book.open_leases(), "expired": book.expired}


class _SharedLease:
    """A lease held in the keeper; `finish` sends it back without waiting."""

    def __init__(self, quota: SharedQuota, lease_id: str, reserved: int):
        self._quota, self.lease_id, self.reserved = quota, lease_id, reserved
        self._open = True

    def finish(self, tokens: int) -> None:
        if self._open:
            self._open = False
            self._quota.finishes.submit((self.lease_id, tokens))


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
        self.local = RateLimiter(clock)  # unlimited tenants, and the fallback
        self._keeper_down_until = float("-inf")
        self._renewing: asyncio.Task | None = None
        self._lease_ids = itertools.count()
        self.admits = _Batches(self._admit, lost=self._unwanted)
        self.finishes = _Batches(self._finish)

    async def admit(self, tenant: Tenant, reserve_tokens: int = 0) -> Lease | _SharedLease:
        if not has_limits(tenant):
            return self.local.admit(tenant, reserve_tokens)
        if self._renewing is None:
            self._renewing = asyncio.ensure_future(self._renew_forever())
        if self.clock() >= self._keeper_down_until:
            try:
                lease_id = f"{self.owner}/{next(self._lease_ids)}"
                kind, value = await self.admits.submit((tenant, reserve_tokens, lease_id))
            except Exception as err:  # the keeper restarting or unreachable
                self._keeper_down(err)
            else:
                if kind == "refused":
                    raise refusal_error(value)
                return _SharedLease(self, str(value), reserve_tokens)
        return self.local.admit(share_of(tenant, self.replicas), reserve_tokens)

    async def drain(self) -> None:
        """Wait until the admissions and finishes submitted so far were sent (before
        this process's loop ends: the finishes are not awaited by anyone)."""
        await self.admits.drain()
        await self.finishes.drain()

    async def _admit(self, batch: list[tuple[Tenant, int, str]]) -> list[Admission]:
        try:
            return await self._call("admit", self.owner, batch)
        except Exception:
            # it may have reached the keeper all the same: withdraw every lease it asked for
            for _, _, lease_id in batch:
                self.finishes.submit((lease_id, 0))
            raise

    def _unwanted(self, answer: Admission) -> None:
        """A lease granted to a request that went away while it waited: give it back."""
        kind, value = answer
        if kind == "lease":
            self.finishes.submit((str(value), 0))

    async def _finish(self, batch: list[tuple[str, int]]) -> None:
        await self._quiet("finish", batch)  # nobody waits for it: failures are logged

    async def _call(self, method: str, *args: Any) -> Any:
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
        # races the call's end, and the renewal loop then never stops
        async with asyncio.timeout(CALL_TIMEOUT_S):
            return await getattr(self.keeper, method).remote(*args)

    async def _quiet(self, method: str, *args: Any) -> None:
        try:
            await self._call(method, self.owner, *args)
        except Exception as err:
            log.warning("tenant limits keeper: %s failed: %r", method, err)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            await self._quiet("renew")

    def _keeper_down(self, err: BaseException) -> None:
        self._keeper_down_until = self.clock() + KEEPER_RETRY_S
        log.warning(
            "tenant limits keeper unavailable (%r): this ingress applies 1/%d of each limit "
            "alone for %g s", err, self.replicas, KEEPER_RETRY_S,
        )  # fmt: skip

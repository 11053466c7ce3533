"""The tenant-limits keeper: the one QuotaBook that ingress replicas admit through
(admission/shared_limits.py has the ingress side and the protocol).

It leaves admission to the ingresses (answers "recovering") for RECOVER_S whenever its
book may lack leases they admitted alone: after it (re)started, after a stall of its own
loop of ADMIT_TIMEOUT_S or more (SIGSTOP, a long pause, a starved CPU: the ingresses' admissions
may have timed out meanwhile), and when an ingress's sync says it admitted alone. Their
syncs bring those leases into the book within RENEW_S, so it admits against all of them
again afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from agentserve.admission.quota_book import (
    DEFAULT_MAX_AGE_S,
    RENEW_S,
    Admission,
    OpenLease,
    QuotaBook,
)
from agentserve.api.auth import Tenant

__all__ = ["ADMIT_TIMEOUT_S", "RECOVER_S", "STALL_S", "TICK_S", "QuotaKeeper"]

RECOVER_S = RENEW_S + 0.5  # a (re)started keeper admits nothing until every ingress synced
ADMIT_TIMEOUT_S = 1.0  # an admission waits no longer on a stalled keeper, then goes alone
# a gap this long between two runs of the keeper's loop may have timed an admission out;
# a shorter one cannot have (the gap measured holds the stall), so it is no stall: a busy
# machine's loop lag must not hand admission to the ingresses' shares for RECOVER_S
STALL_S = ADMIT_TIMEOUT_S
TICK_S = 0.2  # how often the keeper's loop notes that it runs
log = logging.getLogger(__name__)


class QuotaKeeper:
    """The Serve deployment holding the one QuotaBook (async methods: one at a time on
    its event loop, no locks needed)."""

    def __init__(
        self,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        recover_s: float = RECOVER_S,
        stall_s: float | None = STALL_S,
        loop_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`recover_s`: how long after its start, a stall or an ingress that admitted
        alone the keeper leaves admission to the ingresses while their syncs rebuild its
        book (0: none, for tests). `stall_s`: a gap in its loop (timed by `loop_clock`,
        real time) that counts as a stall; None: not watched."""
        self.book = QuotaBook(clock, max_age_s=max_age_s)
        self._clock, self._recover_s = clock, recover_s
        self._ready_at = clock() + recover_s
        self._seen: set[str] = set()  # owners heard from since this keeper started
        self._stall_s, self._loop_clock = stall_s, loop_clock
        self._ran_at: float | None = None  # when the loop last ran (loop_clock)
        self._ticking: asyncio.Task | None = None
        self.recoveries = 0  # after a stall or an ingress that admitted alone

    def recovering(self) -> bool:
        """(Re)started, stalled, or told that an ingress admitted alone: the ingresses'
        open leases may not all be in the book yet."""
        return self._clock() < self._ready_at

    def _recover(self, why: str) -> None:
        if self._recover_s > 0:
            self.recoveries += 1
            log.warning("tenant limits keeper: %s; admission left to the ingresses for "
                        "%.1f s while they sync", why, self._recover_s)  # fmt: skip
        self._ready_at = max(self._ready_at, self._clock() + self._recover_s)

    def _watch(self) -> None:
        """Note that the loop runs; a gap over stall_s since it last ran is a stall."""
        if self._stall_s is None:
            return
        now = self._loop_clock()
        if self._ran_at is not None and now - self._ran_at > self._stall_s:
            self._recover(f"its loop did not run for {now - self._ran_at:.1f} s")
        self._ran_at = now
        if self._ticking is None or self._ticking.done():
            self._ticking = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._watch()

    async def admit(
        self, owner: str, requests: list[tuple[Tenant, int, str, int]]
    ) -> list[Admission]:
        """Admit each (tenant, reserve_tokens, lease id, count) in order: one answer each;
        ("recovering", None) each while `recovering()` (the ingress then admits alone)."""
        self._watch()
        if self.recovering():
            self.book.renew(owner)
            return [("recovering", None)] * len(requests)
        self._seen.add(owner)
        return [self.book.admit(owner, t, r, lease_id, n) for t, r, lease_id, n in requests]

    async def sync(
        self,
        owner: str,
        finished: list[tuple[str, int]],
        open_leases: list[OpenLease],
        history: dict[str, Any] | None = None,
        went_alone: bool = False,
    ) -> tuple[dict[str, int] | None, bool]:
        """Finish each (lease id, tokens used), adopt the open leases the book lacks, add
        `history` (the owner's window, RateLimiter.history), renew `owner`; `went_alone`:
        the owner admitted alone since its last sync (the keeper then recovers). Returns
        (tenant -> requests in flight through the other owners, None while recovering;
        whether the keeper wants the owner's history: it never heard of it)."""
        for lease_id, tokens in finished:
            self.book.finish(owner, lease_id, tokens)
        self._watch()
        if went_alone:
            self._recover(f"ingress {owner} admitted alone")
        first = owner not in self._seen
        self._seen.add(owner)
        if history is not None:
            self.book.restore(history)
        self.book.adopt(owner, open_leases, count_requests=not first)
        elsewhere = None if self.recovering() else self.book.in_flight_elsewhere(owner)
        return elsewhere, first and history is None

    async def renew(self, owner: str) -> int:
        """Renew `owner`; the number of its open leases (for tests and logs)."""
        self.book.renew(owner)
        return self.book.open_leases(owner)

    async def state(self) -> dict[str, Any]:
        """The ingress replicas heard from, open leases, leases expired (for status)."""
        book = self.book
        return {
            "owners": book.owners(),
            "open": book.open_leases(),
            "expired": book.expired,
            "recoveries": self.recoveries,
        }

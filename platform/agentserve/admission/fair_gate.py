"""A turn-taking lock for the validation threads, fair across tenants.

One validation job runs at a time (so a hostile request competes with the event loop for
the GIL, never with a crowd of threads). A job asks at its checkpoints (before each
uncached schema, every few thousand JSON values) whether another tenant waits; if so it
hands the turn over and queues again. The next turn goes to the waiting tenant served
least recently (ties: the earliest ticket), so one tenant's heavy schemas delay another
tenant's request by about one schema per round, not by the whole heavy job.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agentserve.api.errors import OverloadedError, RateLimitError

__all__ = ["FairGate"]


@dataclass(frozen=True)
class _Ticket:
    tenant: str
    seq: int


class FairGate:
    """acquire / checkpoint / release, called from worker threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._holder: str | None = None
        self._waiting: list[_Ticket] = []
        self._served: dict[str, int] = {}  # tenant -> the turn it last got
        self._turns = itertools.count()
        self._seq = itertools.count()

    def acquire(self, tenant: str, deadline: float | None = None) -> None:
        """Wait for the turn; OverloadedError (503) when `deadline` (time.monotonic())
        passes first."""
        with self._cond:
            ticket = _Ticket(tenant, next(self._seq))
            self._waiting.append(ticket)
            try:
                while self._held or self._next() is not ticket:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise self._late(ticket)
                    self._cond.wait(left)
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()
            self._held, self._holder = True, tenant
            self._served[tenant] = next(self._turns)

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    @contextmanager
    def turn(self, tenant: str, deadline: float | None = None) -> Iterator[_Turn]:
        """Hold the turn for one job; the job calls the yielded turn's checkpoint()."""
        self.acquire(tenant, deadline)
        turn = _Turn(self, tenant, deadline)
        try:
            yield turn
        finally:
            if turn.held:
                self.release()

    def others_wait(self, tenant: str) -> bool:
        with self._cond:
            return any(t.tenant != tenant for t in self._waiting)

    def waiting(self) -> int:
        """Tickets waiting for a turn."""
        with self._cond:
            return len(self._waiting)

    def _late(self, ticket: _Ticket) -> RateLimitError | OverloadedError:
        """429 when the tenant's own other jobs held the turns (its excess), else 503."""
        own = (self._held and self._holder == ticket.tenant) or any(
            t.tenant == ticket.tenant and t is not ticket for t in self._waiting
        )
        if own:
            return RateLimitError(
                "This tenant's other requests' schemas are being checked; send fewer at once.",
                code="validation_busy",
            )
        return OverloadedError(
            "the ingress is busy validating other requests' schemas; retry later"
        )

    def _next(self) -> _Ticket | None:
        if not self._waiting:
            return None
        return min(self._waiting, key=lambda t: (self._served.get(t.tenant, -1), t.seq))


class _Turn:
    """One job's hold on the gate."""

    def __init__(self, gate: FairGate, tenant: str, deadline: float | None):
        self.gate, self.tenant, self.deadline = gate, tenant, deadline
        self.held = True
        self.handovers = 0

    def checkpoint(self) -> None:
        """Hand the turn to another tenant that waits, then wait for it again."""
        if not self.gate.others_wait(self.tenant):
            return
        self.handovers += 1
        self.held = False
        self.gate.release()
        self.gate.acquire(self.tenant, self.deadline)
        self.held = True

"""The simulated ingress queue: requests waiting for a replica slot, sent on either in the
runtime's priority order (admission/priority.py: earliest deadline first, batch shed past its
deadline) or first come, first served.

With `priority` a request's deadline is `deadline_s(arrival, objective)`, the runtime's
rule, objective = its tenant's TTFT objective (`QueueClass.objective_s`); the earliest
deadline leaves first, ties in the order requests entered the queue. `sheds(tenant)` is
True for tenants whose class `is_batch_class` (the runtime's test): the simulator refuses
such a request still waiting at its deadline (`remove`). A tenant missing from `classes`
has objective 0 and is never shed (ordered by arrival among its peers). Without
`priority` the queue is a FIFO deque and sheds nothing. Ray-free, numpy-free.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from agentserve.admission.priority import deadline_s, is_batch_class, retry_after_s

__all__ = ["IngressQueue", "QueueClass"]


class _Request(Protocol):
    tenant: str
    arrival_s: float


@dataclass(frozen=True)
class QueueClass:
    """How the ingress treats one tenant: its TTFT objective and its SLA class."""

    objective_s: float
    sla_class: str | None = None


class IngressQueue:
    """Requests waiting for a replica slot (see the module docstring)."""

    def __init__(self, priority: bool, classes: Mapping[str, QueueClass] | None = None):
        self.priority = priority
        self.classes = dict(classes or {})
        self._fifo: deque[_Request] = deque()
        self._heap: list[tuple[float, int, _Request]] = []
        self._order = itertools.count()
        self._waiting: set[int] = set()  # ids of the requests in the heap, not removed

    def objective_s(self, tenant: str) -> float:
        cls = self.classes.get(tenant)
        return cls.objective_s if cls else 0.0

    def deadline_s(self, req: _Request) -> float:
        return deadline_s(req.arrival_s, self.objective_s(req.tenant))

    def sheds(self, tenant: str) -> bool:
        """Whether a request of `tenant` still waiting at its deadline is refused."""
        cls = self.classes.get(tenant)
        return self.priority and cls is not None and is_batch_class(cls.sla_class)

    def retry_after_s(self, tenant: str) -> float:
        """The Retry-After the runtime gives a shed request of `tenant`."""
        return retry_after_s(self.objective_s(tenant))

    def push(self, req: _Request) -> None:
        if not self.priority:
            self._fifo.append(req)
            return
        heapq.heappush(self._heap, (self.deadline_s(req), next(self._order), req))
        self._waiting.add(id(req))

    def requeue(self, reqs: Iterable[_Request]) -> None:
        """Put back requests a leaving replica had not started: at the head (FIFO) or
        by their deadline (priority)."""
        reqs = list(reqs)
        if not self.priority:
            self._fifo.extendleft(reversed(reqs))
            return
        for req in reqs:
            self.push(req)

    def pop(self) -> _Request:
        """The next request to send on (IndexError when none waits)."""
        if not self.priority:
            return self._fifo.popleft()
        while True:
            _, _, req = heapq.heappop(self._heap)
            if id(req) in self._waiting:
                self._waiting.discard(id(req))
                return req

    def remove(self, req: _Request) -> bool:
        """Take `req` out if it is still waiting; False when it was sent on already."""
        if not self.priority:
            try:
                self._fifo.remove(req)
            except ValueError:
                return False
            return True
        if id(req) not in self._waiting:
            return False
        self._waiting.discard(id(req))
        return True

    def __len__(self) -> int:
        return len(self._fifo) if not self.priority else len(self._waiting)

    def __iter__(self) -> Iterator[_Request]:
        """Waiting requests in the order they would be sent on."""
        if not self.priority:
            return iter(list(self._fifo))
        live = [e for e in self._heap if id(e[2]) in self._waiting]
        return iter([req for *_, req in sorted(live, key=lambda e: e[:2])])

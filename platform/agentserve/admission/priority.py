"""Priority by SLA class: which admitted request is sent to a model's replicas next, which
one is refused rather than served late, and the engine priority each request carries.

Where requests wait: admission (admission/shares.py) bounds what a model holds, running and
queued (503 beyond). Of those, at most `replica_slots(model)` per ready replica are sent
on: Serve's max_ongoing_requests of the model deployment (serve/app.py), that is
max_num_seqs running in the engine and as many again queued inside it (in priority order,
below). The rest wait here, in a DispatchQueue, instead of in Serve's router (first come,
first served). The wait counts in the replicas' TTFT (the send-time header is stamped
before it), so the autoscaler sees it as it saw the router's queue.

Order: earliest deadline first, deadline = arrival + the tenant's TTFT objective
(sla.ttft_p95_ms; in open mode autoscaling.open_mode_sla, 1 s unless set), ties in
arrival order. An interactive request (2 s objective) arriving 10 s after a batch one
(20 s) is sent first. A request waits at the head of the line until all the slots it needs
(its choices, n) are free; none overtakes it, so large requests do not starve.

Shedding: a request of a batch-class tenant (sla_class "batch") still waiting here when
its deadline passes gets 429 (code deadline_exceeded) with Retry-After = its TTFT
objective (at least 1 s, at most MAX_RETRY_AFTER_S) instead of being served late. Once sent
on, it is never shed. Other classes are never shed: they wait, earliest deadline first,
until a slot frees or their client goes away; the model's queue bound (503) still applies.

No ready replica (0 or unknown): no limit here. Requests go on to Serve's router, where
waiting requests trigger the scale-up from zero, and the ingress's cold-start hold applies.

Engine priority: with models[].priority_scheduling (default on) the engine runs vLLM's
"priority" policy and each forwarded body carries `priority` = engine_priority(tenant)
(Dispatcher.priority; set on the engine request's copy, serve/engine_request.py):
INTERACTIVE_PRIORITY for every class but batch, BATCH_PRIORITY for batch (lower = sooner).
vLLM orders its waiting queue by (priority, arrival) and, when the KV cache runs out,
preempts the running request with the largest (priority, arrival): batch decoding first.
It does not preempt to free a batch slot (max_num_seqs): a waiting interactive request
takes the next free one. Default on because the engine cannot follow tenant changes
(tenants reach only the ingress, agentserve.tenant_config) and with equal priorities the
policy is first come, first served.

models[].dispatch_order "arrival" turns the ingress part off: requests are sent on first
come, first served (deadline = arrival) and none is shed. Ray-free.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agentserve.api.auth import Tenant
from agentserve.api.errors import RateLimitError
from agentserve.spec import ModelSpec

__all__ = [
    "BATCH_CLASS",
    "BATCH_PRIORITY",
    "INTERACTIVE_PRIORITY",
    "DeadlineExceededError",
    "DispatchQueue",
    "Dispatcher",
    "deadline_s",
    "engine_priority",
    "is_batch_class",
    "replica_slots",
    "retry_after_s",
]

BATCH_CLASS = "batch"
INTERACTIVE_PRIORITY = 0
BATCH_PRIORITY = 1
MAX_RETRY_AFTER_S = 60.0


def replica_slots(model: ModelSpec) -> int:
    """Requests one replica takes at once (Serve's max_ongoing_requests): the engine runs
    max_num_seqs and queues as many again, so a freed slot never waits for the ingress."""
    return 2 * model.engine_slots


def is_batch_class(sla_class: str | None) -> bool:
    """Whether requests of this SLA class are shed past their deadline (batch only)."""
    return (sla_class or "").strip().lower() == BATCH_CLASS


def is_batch(tenant: Tenant) -> bool:
    return is_batch_class(tenant.sla_class)


def deadline_s(arrival_s: float, objective_s: float) -> float:
    """When a request must be sent on: its arrival plus its tenant's TTFT objective."""
    return arrival_s + objective_s


def retry_after_s(objective_s: float) -> float:
    """Retry-After of a shed request: its TTFT objective, within [1, MAX_RETRY_AFTER_S]."""
    return min(MAX_RETRY_AFTER_S, max(1.0, objective_s))


def engine_priority(tenant: Tenant) -> int:
    """vLLM priority of the tenant's requests (lower is served sooner)."""
    return BATCH_PRIORITY if is_batch(tenant) else INTERACTIVE_PRIORITY


class DeadlineExceededError(RateLimitError):
    """429: a batch request waited past its TTFT objective without being sent on."""

    def __init__(self, tenant: str, objective_s: float):
        super().__init__(
            f"tenant {tenant!r} (batch class) waited past its time-to-first-token objective "
            f"({objective_s:g} s) for capacity on this model; it was not started, so it would "
            "only have been late: retry later",
            retry_after_s=retry_after_s(objective_s),
            code="deadline_exceeded",
        )


@dataclass(eq=False)
class _Waiter:
    count: int
    future: asyncio.Future[None]
    gone: bool = field(default=False)
    tenant: str = ""
    since: float = 0.0


class DispatchQueue:
    """One model's slots toward its replicas and the requests waiting for them."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_wait: Callable[[], None] = lambda: None,
    ):
        self.clock, self.on_wait = clock, on_wait
        self.slots: int | None = None  # None: no limit (no ready replica known)
        self.sent = 0  # slots held by requests sent on
        self._heap: list[tuple[float, int, _Waiter]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for *_, w in self._heap if not w.gone)

    def held(self) -> list[tuple[str, float, int]]:
        """[(tenant, seconds waited so far, slots needed)] of the requests waiting now."""
        now = self.clock()
        return [(w.tenant, now - w.since, w.count) for *_, w in self._heap if not w.gone]

    def set_slots(self, slots: int | None) -> None:
        """The slots the ready replicas offer now (None: unlimited); more may send some."""
        self.slots = slots
        self._send()

    async def acquire(
        self, objective_s: float, count: int = 1, *, shed: bool = False, tenant: str = ""
    ) -> None:
        """Returns once `count` slots are the caller's (release them with `release`).
        Waits in deadline order (now + objective_s); with `shed`, raises TimeoutError
        when the deadline passes first. Raising or cancelled, it holds nothing. A request
        that waits calls `on_wait` (the ingress publishes what it holds: serve/held_board.py)."""
        now = self.clock()
        deadline = deadline_s(now, objective_s)
        if self.waiting == 0 and self._fits(count):
            self.sent += count
            return
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(count, future, tenant=tenant, since=now)
        heapq.heappush(self._heap, (deadline, next(self._order), waiter))
        self.on_wait()
        try:
            await asyncio.wait({waiter.future}, timeout=objective_s if shed else None)
        except asyncio.CancelledError:
            self._forget(waiter)
            raise
        if not waiter.future.done():  # timed out still waiting: refused, holds nothing
            self._forget(waiter)
            raise TimeoutError(f"not sent on within {objective_s:g} s")
        # sent on (possibly in the same instant the deadline passed: then it is served)

    def release(self, count: int = 1) -> None:
        self.sent -= count
        self._send()

    def _forget(self, waiter: _Waiter) -> None:
        waiter.gone = True
        if waiter.future.done() and not waiter.future.cancelled():
            self.release(waiter.count)  # granted as it was cancelled: give the slots back
        else:
            waiter.future.cancel()
        self._send()  # a large request at the head may have blocked smaller ones

    def _fits(self, count: int) -> bool:
        return self.slots is None or self.sent == 0 or self.sent + count <= self.slots

    def _send(self) -> None:
        while self._heap:
            _, _, head = self._heap[0]
            if head.gone:
                heapq.heappop(self._heap)
                continue
            if not self._fits(head.count):
                return
            heapq.heappop(self._heap)
            self.sent += head.count
            head.future.set_result(None)


class Dispatcher:
    """Per model: a DispatchQueue, whether its engine schedules by priority and whether
    the queue orders by deadline (else by arrival, nothing shed)."""

    def __init__(
        self,
        models: Sequence[ModelSpec],
        names: Sequence[str],
        ingresses: int = 1,
        on_wait: Callable[[], None] = lambda: None,
    ):
        """`ingresses`: ingress replicas sharing the model replicas; each sends its share
        of a replica's slots (rounded up), so together they keep the engine full without
        queueing in Serve's first-come router. `on_wait()` when a request starts waiting
        (serve/held_board.py)."""
        specs = {m.name: m for m in models}
        self.queues = {name: DispatchQueue(on_wait=on_wait) for name in names}
        self.per_replica = {
            n: math.ceil(replica_slots(specs[n]) / ingresses) for n in names if n in specs
        }
        self.by_priority = {n: specs[n].priority_scheduling for n in names if n in specs}
        self.by_arrival = {n for n in names if n in specs and specs[n].dispatch_order == "arrival"}

    def priority(self, model: str, tenant: Tenant) -> int | None:
        """The engine priority of `tenant`'s requests to `model` (engine_priority); None
        when the model's engine does not schedule by priority (the body keeps its own)."""
        return engine_priority(tenant) if self.by_priority.get(model) else None

    async def send(self, model: str, tenant: Tenant, count: int, ready: int | None) -> None:
        """Wait for `count` slots toward the model's `ready` replicas (see the module
        docstring). DeadlineExceededError (429) for a batch request whose deadline passed
        first."""
        queue = self.queues[model]
        per = self.per_replica.get(model)
        queue.set_slots(ready * per if ready and per else None)
        objective_s, _ = tenant.sla.seconds()
        if model in self.by_arrival:  # first come, first served; never shed
            await queue.acquire(0.0, count, tenant=tenant.name)
            return
        try:
            await queue.acquire(objective_s, count, shed=is_batch(tenant), tenant=tenant.name)
        except TimeoutError:
            raise DeadlineExceededError(tenant.name, objective_s) from None

    def release(self, model: str, count: int) -> None:
        self.queues[model].release(count)

    def waiting(self) -> Mapping[str, int]:
        return {name: q.waiting for name, q in self.queues.items()}

    def held(self) -> dict[str, list[tuple[str, float, int]]]:
        """Per model with requests waiting: DispatchQueue.held."""
        return {name: held for name, q in self.queues.items() if (held := q.held())}

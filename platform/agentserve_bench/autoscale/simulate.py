"""Discrete-event simulator: replays a session trace through N continuous-batching replicas
whose step time and acceptance come from a LatencyModel, asking a controller (normally the
pure policy's `decide`) for the target replica count every `interval_s`.

Semantics: requests wait in one ingress queue (TTFT counts that wait) and go to the ready
replica with the fewest sequences below max_num_seqs. With `priority` (default, as the
runtime's dispatch_order "deadline" + priority_scheduling) the queue sends the earliest
deadline first, deadline = arrival + the tenant's TTFT objective (`tenants`), and a request
of a batch-class tenant still waiting at its deadline is shed: recorded with status "shed"
(a request that missed its SLA; no TTFT), and its client retries the call after the
runtime's Retry-After, at most `shed_retries` times (the SDK's max_retries), each retry a
new request; a call refused every time is given up and its session goes on (see
ingress_queue.py). The runtime's two waiting lines (the ingress's deadline queue, then
vLLM's priority-ordered waiting queue behind max_num_seqs) are one line here, and vLLM's
KV-cache preemption of batch decoding is not modelled (no KV cache). Without `priority`
the queue is first come, first served and sheds nothing. A replica runs steps back to
back while it has work: each step admits dispatched requests (prefilling their uncached
tokens inside the step, first token at its end) and decodes the rest, each emitting the
model's tau tokens (expected value, deterministic). Drafted tokens per step follow the
speculation schedule by batch size. New replicas serve one replica start after the
decision: the engine's measured start (docs/benchmarks/startup.json, measured_start.py)
unless `replica_start_s` overrides it; every ready replica reports its start as the live
ones do, and the policy reads it through `start_stat.measured_start_s`, the adapter's
reduction. Removed replicas stop taking requests and leave when empty. Replica-seconds
count every replica from start decision to exit, standby replicas included (started,
unrouted, promoted at once on a scale-up; see standby.py). The policy's latency inputs come from
`latency_stat.pooled_tenant_latency`, the function the live Ray adapter uses.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from agentserve.autoscale.burst import RECENT_WINDOW_S
from agentserve.autoscale.latency_stat import LatencyWindow, pooled_tenant_latency
from agentserve.autoscale.latency_stat import tpot_ms as tpot_of
from agentserve.autoscale.model import LatencyModel, drafted_for, speculation_schedule
from agentserve.autoscale.policy import Snapshot
from agentserve.autoscale.start_stat import measured_start_s

from agentserve_bench.autoscale.ingress_queue import IngressQueue, QueueClass
from agentserve_bench.autoscale.measured_start import engine_start_s
from agentserve_bench.autoscale.trace import Session, Trace

__all__ = ["Controller", "QueueClass", "RequestRecord", "SimConfig", "SimResult", "simulate"]

Controller = Callable[[Snapshot], int]
"""Snapshot -> target replica count (may keep its own state)."""


@dataclass(frozen=True)
class SimConfig:
    """Simulated fleet. `max_drafted` 0 = no speculation; `adaptive_speculation` False
    drafts `max_drafted` at every batch size instead of the per-batch schedule;
    `standby_replicas` keeps that many started, unrouted replicas (standby.py);
    `priority` orders the ingress queue by deadline and sheds batch past it, with each
    tenant's objective and class from `tenants` (ingress_queue.py). `replica_start_s` None:
    a replica takes the measured start of `engine` (measured_start.engine_start_s); a
    number overrides it."""

    model: LatencyModel = field(default_factory=LatencyModel)
    max_num_seqs: int = 8
    max_drafted: int = 7
    adaptive_speculation: bool = True
    initial_replicas: int = 2
    engine: str = "vllm"
    replica_start_s: float | None = None
    interval_s: float = 5.0
    window_s: float = 30.0
    recent_window_s: float = RECENT_WINDOW_S
    timeline_s: float = 10.0
    standby_replicas: int = 0
    priority: bool = True
    tenants: Mapping[str, QueueClass] = field(default_factory=dict)
    shed_retries: int = 2


@dataclass
class RequestRecord:
    tenant: str
    arrival_s: float
    prompt_tokens: int
    new_tokens: int
    output_tokens: int
    first_token_s: float | None = None
    finish_s: float | None = None
    emitted: float = 0.0
    shed_s: float | None = None
    attempt: int = 0

    @property
    def status(self) -> str:
        """ "served" (finished), "shed" (refused past its deadline) or "open"."""
        if self.shed_s is not None:
            return "shed"
        return "served" if self.finish_s is not None else "open"

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_s is None else 1000 * (self.first_token_s - self.arrival_s)

    @property
    def tpot_ms(self) -> float | None:
        return tpot_of(self.first_token_s, self.finish_s, self.output_tokens)


@dataclass
class _Replica:
    id: int
    born_s: float
    ready_s: float
    start_s: float  # how long its start took (what it reports once ready)
    draining: bool = False
    standby: bool = False
    busy: bool = False
    dead_s: float | None = None
    running: list[RequestRecord] = field(default_factory=list)
    pending: list[RequestRecord] = field(default_factory=list)

    def load(self) -> int:
        return len(self.running) + len(self.pending)


@dataclass
class SimResult:
    requests: list[RequestRecord]
    replica_seconds: float
    scaling_actions: int
    end_s: float
    timeline: list[dict] = field(default_factory=list)


class _Sim:
    """Event loop state; `run` drives it. Events: (time, seq, kind, payload)."""

    def __init__(self, trace: Trace, controller: Controller, cfg: SimConfig):
        self.trace, self.controller, self.cfg = trace, controller, cfg
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.replicas: list[_Replica] = []
        self.ids = itertools.count()
        self.queue = IngressQueue(cfg.priority, cfg.tenants)
        self.settled = 0  # calls served or given up
        self.done: list[RequestRecord] = []
        self.all: list[RequestRecord] = []
        self.arrivals: deque[RequestRecord] = deque()  # within the look-back window
        self.actions = 0
        self.timeline: list[dict] = []
        start = cfg.replica_start_s
        self.start_s = engine_start_s(cfg.engine) if start is None else start
        self.last_start_s: float | None = None  # the last measured start the policy saw
        max_k = cfg.max_drafted
        self.schedule = (
            speculation_schedule(cfg.model, cfg.max_num_seqs, max_k)
            if cfg.adaptive_speculation
            else [(1, cfg.max_num_seqs, max_k)]
        )

    def push(self, t: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    # -- fleet -------------------------------------------------------------------------
    def live(self) -> list[_Replica]:
        """Routed replicas (ready or warming), not draining, not standby."""
        return [r for r in self.replicas if r.dead_s is None and not r.draining and not r.standby]

    def standby(self) -> list[_Replica]:
        """Unrouted standby replicas, ready ones first."""
        pool = [r for r in self.replicas if r.dead_s is None and r.standby]
        return sorted(pool, key=lambda r: (r.ready_s, r.id))

    def start_replica(self, t: float, ready_now: bool = False, standby: bool = False) -> None:
        # ready at once: started before the trace, in the same time
        ready = t if ready_now else t + self.start_s
        r = _Replica(next(self.ids), t, ready, self.start_s, standby=standby)
        self.replicas.append(r)
        self.push(ready, "ready", r)

    def refill_standby(self, t: float) -> None:
        for _ in range(self.cfg.standby_replicas - len(self.standby())):
            self.start_replica(t, standby=True)

    def retire(self, r: _Replica, t: float) -> None:
        r.draining = True
        if r.ready_s > t or (not r.busy and not r.running and not r.pending):
            r.dead_s = t  # warming, or idle: leaves at once
            self.queue.requeue(r.pending)
            r.pending = []

    def scale_to(self, target: int, t: float) -> None:
        live = self.live()
        if target == len(live):
            return
        self.actions += 1
        if target > len(live):
            need = target - len(live)
            for r in [r for r in self.replicas if r.draining and r.dead_s is None][:need]:
                r.draining, need = False, need - 1  # un-drain: already warm
            for r in self.standby()[:need]:
                r.standby, need = False, need - 1  # promote: started already
            for _ in range(need):
                self.start_replica(t)
            self.refill_standby(t)
            return
        # remove warming replicas first, then the least loaded ready ones
        victims = sorted(live, key=lambda r: (r.ready_s <= t, r.load(), -r.id))
        for r in victims[: len(live) - target]:
            idle = r.ready_s <= t and not r.busy and not r.load()
            if idle and len(self.standby()) < self.cfg.standby_replicas:
                r.standby = True  # park: stays started, takes no traffic
            else:
                self.retire(r, t)

    # -- requests ----------------------------------------------------------------------
    def issue(self, session: Session, index: int, t: float, attempt: int = 0) -> None:
        call = session.calls[index]
        req = RequestRecord(
            session.tenant, t, call.prompt_tokens, call.new_tokens, call.output_tokens
        )
        req.attempt = attempt
        self.all.append(req)
        self.arrivals.append(req)
        self.queue.push(req)
        self.pending_next[id(req)] = (session, index)
        if self.queue.sheds(req.tenant):
            self.push(self.queue.deadline_s(req), "deadline", req)
        self.dispatch(t)

    def deadline(self, req: RequestRecord, t: float) -> None:
        """A batch request's deadline: shed it if it still waits (admission/priority.py)."""
        if not self.queue.remove(req):
            return
        req.shed_s = t
        session, index = self.pending_next.pop(id(req))
        if req.attempt < self.cfg.shed_retries:
            retry_at = t + self.queue.retry_after_s(req.tenant)
            self.push(retry_at, "retry", (session, index, req.attempt + 1))
        else:  # given up: the session goes on without this call
            self.next_call(session, index, t)

    def next_call(self, session: Session, index: int, t: float) -> None:
        self.settled += 1
        if index + 1 < len(session.calls):
            self.push(t + session.calls[index].pause_s, "call", (session, index + 1))

    def dispatch(self, t: float) -> None:
        ready = [r for r in self.live() if r.ready_s <= t]
        while self.queue and ready:
            r = min(ready, key=lambda r: (r.load(), r.id))
            if r.load() >= self.cfg.max_num_seqs:
                return
            r.pending.append(self.queue.pop())
            if not r.busy:
                self.start_step(r, t)

    def start_step(self, r: _Replica, t: float) -> None:
        admit, decode = r.pending, r.running
        r.pending, r.running = [], admit + decode
        batch = len(r.running)
        k = drafted_for(self.schedule, batch) if decode else 0
        ms = self.cfg.model.step_ms(batch, k) + self.cfg.model.prefill_ms(
            sum(q.new_tokens for q in admit)
        )
        r.busy = True
        self.push(t + ms / 1000.0, "step", (r, admit, decode, self.cfg.model.tau(batch, k)))

    def end_step(self, t: float, r: _Replica, admit, decode, tau: float) -> None:
        for q in admit:
            q.first_token_s, q.emitted = t, 1.0
        for q in decode:
            q.emitted += tau
        finished = [q for q in r.running if q.emitted >= q.output_tokens]
        r.running = [q for q in r.running if q.emitted < q.output_tokens]
        for q in finished:
            q.finish_s = t
            self.done.append(q)
            self.next_call(*self.pending_next.pop(id(q)), t)
        r.busy = False
        if r.draining and not r.running and not r.pending:
            r.dead_s = t
        self.dispatch(t)
        if not r.busy and (r.running or r.pending):
            self.start_step(r, t)

    # -- observation -------------------------------------------------------------------
    def snapshot(self, t: float) -> Snapshot:
        horizon = t - self.cfg.window_s
        while self.arrivals and self.arrivals[0].arrival_s < horizon:
            self.arrivals.popleft()
        ttft: dict[str, list[float]] = {}
        tpot: dict[str, list[float]] = {}
        for q in reversed(self.done):
            if q.finish_s is not None and q.finish_s < horizon:
                break
            if q.tpot_ms is not None:
                tpot.setdefault(q.tenant, []).append(q.tpot_ms)
        for q in self.all[-2000:]:  # recent requests: first tokens in the window, or waiting
            if q.shed_s is not None:
                continue  # refused: no first token, not waiting (the runtime records none)
            if q.first_token_s is None:
                ttft.setdefault(q.tenant, []).append(1000 * (t - q.arrival_s))
            elif q.first_token_s >= horizon:
                ttft.setdefault(q.tenant, []).append(q.ttft_ms or 0.0)
        # one pooled window: histograms add, so splitting it by replica gives the same
        windows = {
            name: LatencyWindow.of(ttft.get(name, []), tpot.get(name, []))
            for name in set(ttft) | set(tpot)
        }
        tenants = pooled_tenant_latency([windows])
        live = self.live()
        arrivals = list(self.arrivals)
        recent = t - self.cfg.recent_window_s
        running = sum(len(r.running) + len(r.pending) for r in self.replicas if r.dead_s is None)
        started = [r.start_s for r in self.replicas if r.dead_s is None and r.ready_s <= t]
        self.last_start_s = measured_start_s(started, self.last_start_s)
        return Snapshot(
            now_s=t,
            ready_replicas=sum(1 for r in live if r.ready_s <= t),
            warming_ages_s=tuple(t - r.born_s for r in live if r.ready_s > t),
            draining_replicas=sum(
                1 for r in self.replicas if r.draining and r.dead_s is None and not r.standby
            ),
            tenants=tenants,
            arrival_rate_rps=len(arrivals) / self.cfg.window_s,
            recent_arrival_rate_rps=sum(1 for q in arrivals if q.arrival_s >= recent)
            / self.cfg.recent_window_s,
            mean_prompt_tokens=_mean([q.new_tokens for q in arrivals]),
            mean_output_tokens=_mean([q.output_tokens for q in arrivals]),
            in_flight=running + len(self.queue),
            queued=len(self.queue),
            replica_start_s=self.last_start_s,
        )

    # -- loop --------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.pending_next: dict[int, tuple[Session, int]] = {}
        for _ in range(self.cfg.initial_replicas):
            self.start_replica(0.0, ready_now=True)
        for _ in range(self.cfg.standby_replicas):
            self.start_replica(0.0, ready_now=True, standby=True)
        for s in self.trace.sessions:
            self.push(s.start_s, "call", (s, 0))
        self.push(0.0, "tick")
        total = self.trace.num_calls
        t = 0.0
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            if kind == "call":
                self.issue(*payload, t)  # type: ignore[misc]
            elif kind == "retry":
                session, index, attempt = payload  # type: ignore[misc]
                self.issue(session, index, t, attempt)
            elif kind == "deadline":
                self.deadline(payload, t)  # type: ignore[arg-type]
            elif kind == "step":
                self.end_step(t, *payload)  # type: ignore[misc]
            elif kind == "ready":
                self.dispatch(t)
            elif kind == "tick":
                self.tick(t)
                if self.settled < total:
                    self.push(t + self.cfg.interval_s, "tick")
        end = max(t, self.trace.config.duration_s)
        seconds = sum((r.dead_s if r.dead_s is not None else end) - r.born_s for r in self.replicas)
        return SimResult(self.all, seconds, self.actions, end, self.timeline)

    def tick(self, t: float) -> None:
        snap = self.snapshot(t)
        self.scale_to(max(0, int(self.controller(snap))), t)
        if not self.timeline or t - self.timeline[-1]["t"] >= self.cfg.timeline_s:
            self.timeline.append(
                {
                    "t": round(t, 1),
                    "replicas": len(self.live()),
                    "standby": len(self.standby()),
                    "ready": snap.ready_replicas,
                    "in_flight": snap.in_flight,
                    "ttft_p95_ms": {n: v.ttft_p95_ms for n, v in snap.tenants.items()},
                    "tpot_p95_ms": {n: v.tpot_p95_ms for n, v in snap.tenants.items()},
                }
            )
        self.dispatch(t)


def _mean(values: list[int]) -> float:
    return float(np.mean(values)) if values else 0.0


def simulate(trace: Trace, controller: Controller, cfg: SimConfig | None = None) -> SimResult:
    """Replay `trace` to the end (every call finished) under `controller`."""
    return _Sim(trace, controller, cfg or SimConfig()).run()

"""Requests the ingress holds, carried to the autoscaler.

The ingress sends each model at most its replicas' slots (admission/priority.py) and keeps
the rest in its own deadline-ordered queue; Ray's autoscaling context counts only what
reached a handle or a replica, so without this board the live policy would size the fleet
for the requests it can already see and never for the line behind them (the simulator
sees both). Each ingress replica publishes, per model, what it holds now, and the model
replicas carry the freshest publication into their `record_autoscaling_stats`
(serve/replica_stats.py -> autoscale/ray_policy.py), where the policy adds it to its queue
and its TTFT windows.

Contract:
- A publication (`HeldReport`, one per ingress replica and model, key
  `<scope>/<model>/<ingress id>`) holds the wall time it was made, the slots its waiting
  requests need (`held`), and per tenant a TTFT histogram (latency_stat buckets) of their
  waits so far plus the waits of batch requests shed past their deadline within the
  window (a shed request never reaches a replica, so no replica counts it).
- An ingress publishes when a request starts waiting, then every PUBLISH_S while it holds
  any or a shed request is in its window, then once more with nothing held; idle, it
  writes nothing.
- A reader merges the fresh publications of every ingress (newer than STALE_S: an ingress
  that died or stopped leaves its last one behind) and deletes the ones older than
  FORGET_S. Its `at` is the newest merged, so the adapter can take the freshest reading
  among the replicas, which all read the same board.
- The store is injected (`HeldStore`: put / get / keys / delete of bytes, synchronous);
  serve/app.py gives it Ray's GCS key-value store, tests a dict. Ray-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agentserve.autoscale.latency_stat import LatencyWindow, histogram

__all__ = ["FORGET_S", "PUBLISH_S", "STALE_S", "HeldBoard", "HeldReport", "HeldStore"]
__all__ += ["read_held"]

log = logging.getLogger(__name__)
PUBLISH_S = 1.0
STALE_S = 15.0
FORGET_S = 300.0


class HeldStore(Protocol):
    def put(self, key: str, value: bytes) -> None: ...
    def get(self, key: str) -> bytes | None: ...
    def keys(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class HeldReport:
    """What one or more ingresses hold for one model: `held` slots waiting, per tenant the
    waits (held so far, shed) as LatencyWindows with TTFT only, published at `at`."""

    at: float
    held: int = 0
    tenants: Mapping[str, LatencyWindow] = field(default_factory=dict)

    def to_json(self) -> bytes:
        tenants = {
            name: {"ttft": {str(i): n for i, n in w.ttft.items()}, "requests": w.requests}
            for name, w in self.tenants.items()
        }
        return json.dumps({"at": self.at, "held": self.held, "tenants": tenants}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> HeldReport:
        data = json.loads(raw)
        tenants = {
            str(name): LatencyWindow(
                {int(i): float(n) for i, n in w["ttft"].items()}, {}, int(w["requests"])
            )
            for name, w in data.get("tenants", {}).items()
        }
        return cls(float(data["at"]), int(data["held"]), tenants)

    @classmethod
    def merged(cls, reports: Iterable[HeldReport]) -> HeldReport | None:
        """The sum of several ingresses' publications (None for none)."""
        reports = list(reports)
        if not reports:
            return None
        tenants: dict[str, LatencyWindow] = {}
        for report in reports:
            for name, w in report.tenants.items():
                old = tenants.get(name, LatencyWindow())
                ttft = dict(old.ttft)
                for i, n in w.ttft.items():
                    ttft[i] = ttft.get(i, 0.0) + n
                tenants[name] = LatencyWindow(ttft, {}, old.requests + w.requests)
        return cls(max(r.at for r in reports), sum(r.held for r in reports), tenants)


def _prefix(scope: str, model: str) -> str:
    return f"{scope}/{model}/"


def read_held(
    store: HeldStore, scope: str, model: str, now: float | None = None
) -> HeldReport | None:
    """The fresh publications for `model`, merged (None: no ingress published within
    STALE_S); publications older than FORGET_S are deleted. Synchronous (the store is)."""
    now = time.time() if now is None else now
    fresh: list[HeldReport] = []
    for key in store.keys(_prefix(scope, model)):
        raw = store.get(key)
        if raw is None:
            continue
        try:
            report = HeldReport.from_json(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("unreadable held-requests publication %s", key)
            continue
        if now - report.at > FORGET_S:
            with contextlib.suppress(Exception):
                store.delete(key)
        elif now - report.at <= STALE_S:
            fresh.append(report)
    return HeldReport.merged(fresh)


Waiting = Callable[[], Mapping[str, list[tuple[str, float, int]]]]
"""model -> [(tenant, seconds waited so far, slots needed)] of the requests held now."""


class HeldBoard:
    """One ingress replica's publisher. Call `wake()` when a request starts waiting and
    `shed(model, tenant, waited_s)` when one is refused past its deadline; the board then
    publishes from `waiting` (see the module docstring) until nothing is held."""

    def __init__(
        self,
        store: HeldStore,
        scope: str,
        ingress_id: str,
        waiting: Waiting,
        window_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        publish_s: float = PUBLISH_S,
    ):
        self.store, self.scope, self.ingress_id = store, scope, ingress_id
        self.waiting, self.window_s, self.clock = waiting, window_s, clock
        self.publish_s = publish_s
        self._shed: dict[str, deque[tuple[float, str, float]]] = {}  # model -> (at, tenant, ms)
        self._published: set[str] = set()  # models whose last publication held something
        self._task: asyncio.Task[None] | None = None

    def shed(self, model: str, tenant: str, waited_s: float) -> None:
        self._shed.setdefault(model, deque()).append((self.clock(), tenant, waited_s * 1e3))
        self.wake()

    def wake(self) -> None:
        """Start publishing (no-op while already publishing, or off an event loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())

    def reports(self) -> dict[str, HeldReport]:
        """Per model with anything held or shed in the window, or published so before:
        its report now."""
        now = self.clock()
        out: dict[str, HeldReport] = {}
        waiting = self.waiting()
        for model in set(waiting) | set(self._shed) | self._published:
            shed = self._shed.get(model, deque())
            while shed and shed[0][0] < now - self.window_s:
                shed.popleft()
            if not shed:
                self._shed.pop(model, None)
            samples: dict[str, list[float]] = {}
            held = 0
            for tenant, waited_s, slots in waiting.get(model, []):
                samples.setdefault(tenant, []).append(waited_s * 1e3)
                held += slots
            for _, tenant, ms in shed:
                samples.setdefault(tenant, []).append(ms)
            tenants = {t: LatencyWindow(histogram(s), {}, len(s)) for t, s in samples.items()}
            out[model] = HeldReport(now, held, tenants)
        return out

    def publish(self) -> bool:
        """Write every model's report now; True while anything is still held or shed."""
        return self._write(self.reports())

    def _write(self, reports: Mapping[str, HeldReport]) -> bool:
        busy = False
        for model, report in reports.items():
            busy = busy or bool(report.tenants)
            key = _prefix(self.scope, model) + self.ingress_id
            try:
                self.store.put(key, report.to_json())
            except Exception:  # the board is advisory: never fail a request over it
                log.warning("publishing held requests for %s failed", model, exc_info=True)
                continue
            if report.tenants:
                self._published.add(model)
            else:
                self._published.discard(model)
        return busy

    async def _run(self) -> None:
        # the reports are read on the event loop (the queues live there), written off it
        # (the store's calls block)
        while await asyncio.to_thread(self._write, self.reports()):
            await asyncio.sleep(self.publish_s)

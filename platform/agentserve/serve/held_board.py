"""Requests the ingress holds, carried to the autoscaler.

The ingress sends each model at most its replicas' slots (admission/priority.py) and keeps
the rest in its own deadline-ordered queue; Ray's autoscaling context counts only what
reached a handle or a replica, so without this board the live policy would size the fleet
for the requests it can already see and never for the line behind them (the simulator
sees both). Each ingress replica publishes, per autoscaled model, what it holds now; the
SLA policy reads the board in Ray's controller each time it decides
(autoscale/ray_policy.py) and adds it to its queue and its TTFT windows.

Contract:
- A publication (`HeldReport`, one per ingress replica and model, key
  `<scope>/<model, URL-quoted>/<ingress id>`) holds the wall time it was made, the slots
  its waiting requests need (`held`), and per tenant a TTFT histogram (latency_stat
  buckets) of their waits so far. Requests shed past their deadline are not in it: the
  simulator, whose figures the policy's thresholds were chosen on, records none either.
- An ingress publishes when a request starts waiting, then every PUBLISH_S while it holds
  any, then once more with nothing held; idle, it writes nothing. A request that starts
  waiting while the last write is in flight is published after it (no lost wake-up).
- A reader merges the publications of every ingress made within STALE_S (a busy ingress
  republishes every PUBLISH_S; an ingress that died leaves its last one behind) and not
  dated more than SKEW_S ahead of its own clock; it deletes those older than FORGET_S. An
  ingress deletes its own when it stops (`close`).
- The store is injected (`HeldStore`: put / get / keys / delete of bytes, synchronous);
  serve/gcs_board.py gives it Ray's GCS key-value store, tests a dict. Ray-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote

from agentserve.autoscale.latency_stat import LatencyWindow, histogram
from agentserve.spec import DeploymentSpec

__all__ = ["FORGET_S", "HELD_SCOPE", "PUBLISH_S", "SKEW_S", "STALE_S", "HeldBoard", "HeldReport"]
__all__ += ["HeldStore", "MemoryHeldStore", "read_held", "sla_scaled_models"]

log = logging.getLogger(__name__)
PUBLISH_S = 1.0
STALE_S = 5.0
SKEW_S = 2.0
FORGET_S = 300.0
READ_BUDGET_S = 1.0  # a reader stops listing publications after this long (a slow store)
HELD_SCOPE = "requests"  # the board's keys: <scope>/<model>/<ingress id>


class HeldStore(Protocol):
    def put(self, key: str, value: bytes) -> None: ...
    def get(self, key: str) -> bytes | None: ...
    def keys(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...


class MemoryHeldStore:
    """A HeldStore in one process's memory (tests; an ingress and its policy in one process)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def keys(self, prefix: str) -> list[str]:
        return [k for k in self.data if k.startswith(prefix)]

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


@dataclass(frozen=True)
class HeldReport:
    """What one or more ingresses hold for one model: `held` slots waiting, per tenant the
    waits so far as LatencyWindows with TTFT only, published at `at`."""

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


def sla_scaled_models(spec: DeploymentSpec) -> list[str]:
    """The models whose SLA policy reads the board: those that autoscale (min < max) under
    autoscaling.policy "sla"."""
    if spec.autoscaling.policy != "sla":
        return []
    return [m.name for m in spec.models if m.replicas.min_replicas < m.replicas.max_replicas]


def _prefix(scope: str, model: str) -> str:
    return f"{scope}/{quote(model, safe='')}/"  # a "/" in a name must not widen the prefix


def read_held(
    store: HeldStore, scope: str, model: str, now: float | None = None
) -> HeldReport | None:
    """The fresh publications for `model`, merged (None: none fresh); publications older
    than FORGET_S are deleted. Synchronous (the store is): one call per ingress, and no
    more after READ_BUDGET_S (the policy decides on what it read by then)."""
    now = time.time() if now is None else now
    started = time.monotonic()
    fresh: list[HeldReport] = []
    for key in store.keys(_prefix(scope, model)):
        if time.monotonic() - started > READ_BUDGET_S:
            log.warning("reading held-requests publications took over %g s", READ_BUDGET_S)
            break
        raw = store.get(key)
        if raw is None:
            continue
        try:
            report = HeldReport.from_json(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("unreadable held-requests publication %s", key)
            continue
        age = now - report.at
        if age > FORGET_S:
            with contextlib.suppress(Exception):
                store.delete(key)
        elif -SKEW_S <= age <= STALE_S:
            fresh.append(report)
    return HeldReport.merged(fresh)


Waiting = Callable[[], Mapping[str, list[tuple[str, float, int]]]]
"""model -> [(tenant, seconds waited so far, slots needed)] of the requests held now."""


class HeldBoard:
    """One ingress replica's publisher for the autoscaled `models`. Call `wake()` when a
    request starts waiting; the board then publishes from `waiting` (see the module
    docstring) until nothing is held. `close()` when the ingress stops."""

    def __init__(
        self,
        store: HeldStore,
        scope: str,
        ingress_id: str,
        waiting: Waiting,
        models: Collection[str],
        clock: Callable[[], float] = time.time,
        publish_s: float = PUBLISH_S,
    ):
        self.store, self.scope, self.ingress_id = store, scope, ingress_id
        self.waiting, self.models, self.clock = waiting, set(models), clock
        self.publish_s = publish_s
        self._published: set[str] = set()  # models whose last publication held something
        self._written: set[str] = set()  # keys this board wrote (deleted by close)
        self._dirty = False  # a request started waiting since the last report
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # a write in its thread vs close
        self._closed = False

    def wake(self) -> None:
        """Publish soon (off an event loop: only marked; the next publish picks it up)."""
        self._dirty = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())

    def reports(self) -> dict[str, HeldReport]:
        """Per autoscaled model holding anything, or that did at the last publication:
        its report now."""
        self._dirty = False
        now = self.clock()
        out: dict[str, HeldReport] = {}
        waiting = {m: w for m, w in self.waiting().items() if m in self.models}
        for model in set(waiting) | self._published:
            samples: dict[str, list[float]] = {}
            held = 0
            for tenant, waited_s, slots in waiting.get(model, []):
                samples.setdefault(tenant, []).append(waited_s * 1e3)
                held += slots
            tenants = {t: LatencyWindow(histogram(s), {}, len(s)) for t, s in samples.items()}
            out[model] = HeldReport(now, held, tenants)
        return out

    def publish(self) -> bool:
        """Write every model's report now; True while anything is still held."""
        return self._write(self.reports())

    def _write(self, reports: Mapping[str, HeldReport]) -> bool:
        with self._lock:  # close() waits for a write in flight, and none follows it
            return False if self._closed else self._write_open(reports)

    def _write_open(self, reports: Mapping[str, HeldReport]) -> bool:
        busy = False
        for model, report in reports.items():
            busy = busy or report.held > 0
            key = _prefix(self.scope, model) + self.ingress_id
            try:
                self.store.put(key, report.to_json())
            except Exception:  # the board is advisory: never fail a request over it
                log.warning("publishing held requests for %s failed", model, exc_info=True)
                continue
            self._written.add(key)
            if report.held > 0:
                self._published.add(model)
            else:
                self._published.discard(model)
        return busy

    async def _run(self) -> None:
        # reports are read on the event loop (the queues live there), written off it (the
        # store's calls block); a wake during the write is published after it
        while True:
            busy = await asyncio.to_thread(self._write, self.reports())
            if not busy and not self._dirty:
                return
            await asyncio.sleep(self.publish_s)

    async def aclose(self) -> None:
        """Stop publishing and delete this ingress's publications (on its event loop)."""
        if self._task is not None:
            self._task.cancel()
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Delete this ingress's publications and write none after (best effort: readers
        also age them out). Blocks while a write is in flight."""
        with self._lock:
            self._closed = True
            for key in list(self._written):
                with contextlib.suppress(Exception):
                    self.store.delete(key)
            self._written.clear()

"""Per-replica autoscaling signals: per-tenant TTFT/TPOT windows, arrivals and token means,
engine queue and batch, DFlash acceptance by batch size, the replica's own start time;
`autoscaling_stats` encodes them
for Ray Serve's `record_autoscaling_stats` (see autoscale/ray_policy.py).

Contracts:
- TTFT runs from the time the ingress admitted and sent the request (header
  `x-agentserve-sent-at-ns`, wall-clock ns, set by serve/spans.trace_headers), so router
  and replica queue time count; without the header (or with a clock ahead of ours) it
  runs from the replica's receipt. Requests still waiting for a first
  token count as TTFT samples of their age so far, and those that end without one
  (cancelled, failed) of their age at the end.
- TPOT = (last token time - first token time) / (output tokens - 1), per output token, not
  per engine step (one DFlash step emits several tokens); requests with < 2 tokens have none.
- Every window covers the last `window_s` seconds (samples by finish time, arrivals by
  receipt time). The replica publishes the windows as histograms and the autoscaler
  pools them across replicas (autoscale/latency_stat.py: the one p95, nearest-rank on
  the pooled histogram, the statistic the simulator uses too); the replica computes none.
- `start_s` is how long the replica took to start (construction to engine ready, set by
  the replica once its engine is ready); None until then.
- With idle sleep on (serve/sleep_gate.py) the stats also say whether the engine sleeps
  now and how long its last wake took.
The clock is injected (wall time by default: the accept header is wall time).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agentserve.autoscale.burst import RECENT_WINDOW_S
from agentserve.autoscale.latency_stat import LatencyWindow, tpot_ms
from agentserve.autoscale.ray_policy import encode_replica_stats
from agentserve.engine.delta_tracker import DeltaTracker
from agentserve.engine.protocol import Delta, EngineStats
from agentserve.serve.sleep_gate import SleepState
from agentserve.serve.spans import SENT_AT_HEADER, TENANT_HEADER
from agentserve.speculation.by_batch import BatchCounts, acceptance_by_bucket, counts_delta

__all__ = ["ACCEPTED_AT_HEADER", "TENANT_HEADER", "ReplicaStats"]

ACCEPTED_AT_HEADER = SENT_AT_HEADER
ANONYMOUS = "anonymous"


@dataclass
class _Open(DeltaTracker):
    """An open request: its tenant, when the ingress sent it, its stream so far."""

    tenant: str
    accepted_s: float


@dataclass(frozen=True)
class _Done:
    end_s: float
    tenant: str
    ttft_ms: float | None
    tpot_ms: float | None
    prompt_tokens: int  # not served by the prefix cache
    output_tokens: int


def accepted_at(headers: Mapping[str, str], now: float) -> float:
    """The ingress send time (seconds) from the request headers, never later than `now`."""
    try:
        value = int(headers[ACCEPTED_AT_HEADER]) / 1e9
    except (KeyError, TypeError, ValueError):
        return now
    return min(value, now)


class ReplicaStats:
    """Sliding windows of one replica. Call begin -> see (each delta) -> end per request."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.time):
        self.window_s, self.clock = window_s, clock
        self._open: dict[str, _Open] = {}
        self._done: deque[_Done] = deque()
        self._arrivals: deque[float] = deque()
        self._spec: deque[tuple[float, tuple[BatchCounts, ...]]] = deque()
        self._batches: deque[tuple[float, int]] = deque()  # (time, engine batch) samples
        self.start_s: float | None = None

    def begin(self, request_id: str, headers: Mapping[str, str]) -> None:
        now = self.clock()
        tenant = headers.get(TENANT_HEADER) or ANONYMOUS
        self._open[request_id] = _Open(tenant, accepted_at(headers, now))
        self._arrivals.append(now)

    def see(self, request_id: str, delta: Delta) -> None:
        call = self._open.get(request_id)
        if call is None:
            return
        call.see(delta, self.clock())

    def end(self, request_id: str) -> None:
        """Close a request (finished, failed or cancelled); idempotent."""
        call = self._open.pop(request_id, None)
        if call is None:
            return
        now = self.clock()
        # no first token: it waited this long for one (a client that gave up, a timeout);
        # dropping it would take the worst samples out of the window under overload
        ttft = call.ttft(call.accepted_s) if call.first is not None else now - call.accepted_s
        tokens = call.completion_tokens
        tpot = tpot_ms(call.first, call.last, tokens)
        uncached = max(0, call.prompt_tokens - call.cached_tokens)  # what prefill computed
        done = _Done(now, call.tenant, ttft * 1000.0, tpot, uncached, tokens)
        self._done.append(done)

    def _trim(self, now: float) -> None:
        start = now - self.window_s
        while self._done and self._done[0].end_s < start:
            self._done.popleft()
        while self._arrivals and self._arrivals[0] < start:
            self._arrivals.popleft()

    def _samples(self) -> dict[str, tuple[list[float], list[float], int]]:
        """Per tenant over the window: TTFT samples (waiting requests by age), TPOT
        samples, and requests (finished in the window plus open)."""
        now = self.clock()
        self._trim(now)
        out: dict[str, tuple[list[float], list[float], int]] = {}

        def slot(tenant: str) -> tuple[list[float], list[float], int]:
            ttft, tpot, n = out.get(tenant, ([], [], 0))
            out[tenant] = (ttft, tpot, n + 1)
            return out[tenant]

        for d in self._done:
            ttft, tpot, _ = slot(d.tenant)
            if d.ttft_ms is not None:
                ttft.append(d.ttft_ms)
            if d.tpot_ms is not None:
                tpot.append(d.tpot_ms)
        for call in self._open.values():
            ttft, _, _ = slot(call.tenant)
            if call.first is None:
                ttft.append((now - call.accepted_s) * 1000.0)
        return out

    def windows(self) -> dict[str, LatencyWindow]:
        """The same window as bucket counts: what the replica publishes, so the autoscaler
        can pool every replica's samples (autoscale/latency_stat.py)."""
        return {
            name: LatencyWindow.of(ttft, tpot, n)
            for name, (ttft, tpot, n) in self._samples().items()
        }

    def arrival_rate_rps(self, window_s: float | None = None) -> float:
        """Arrivals per second over the last `window_s` (default: the whole window)."""
        now = self.clock()
        self._trim(now)
        w = self.window_s if window_s is None else min(window_s, self.window_s)
        return sum(1 for t in self._arrivals if t >= now - w) / w

    def mean_tokens(self) -> tuple[float, float, int]:
        """(mean prompt tokens, mean output tokens, how many) of requests finished in the
        window with output: the count weights this replica's means when the autoscaler
        pools them. Prompt tokens are those the prefix cache did not serve (what prefill
        computed; the simulator's `new_tokens`): an agent's turn re-sends a long cached
        conversation, and planning prefill for all of it over-sized the fleet."""
        self._trim(self.clock())
        done = [d for d in self._done if d.output_tokens > 0]
        if not done:
            return 0.0, 0.0, 0
        return (
            sum(d.prompt_tokens for d in done) / len(done),
            sum(d.output_tokens for d in done) / len(done),
            len(done),
        )

    def tpot_mean(self, engine: EngineStats) -> tuple[float, float, int] | None:
        """(mean TPOT ms of the requests finished in the window, mean engine batch over
        the window sampled at each call, how many TPOTs), None without a TPOT: what the
        autoscaler refits a latency prior from (autoscale/step_refit.py)."""
        now = self.clock()
        self._trim(now)
        self._batches.append((now, engine.running))
        while self._batches and self._batches[0][0] < now - self.window_s:
            self._batches.popleft()
        tpots = [d.tpot_ms for d in self._done if d.tpot_ms is not None]
        if not tpots:
            return None
        batch = sum(b for _, b in self._batches) / len(self._batches)
        return sum(tpots) / len(tpots), batch, len(tpots)

    def acceptance_by_batch(self, engine: EngineStats) -> dict[str, float]:
        """DFlash acceptance length per batch bucket over the window, from the engine's
        cumulative spec_by_batch counters (sampled at each call)."""
        now = self.clock()
        self._spec.append((now, engine.spec_by_batch))
        while len(self._spec) > 1 and self._spec[1][0] <= now - self.window_s:
            self._spec.popleft()
        base = self._spec[0][1] if len(self._spec) > 1 else ()
        return acceptance_by_bucket(counts_delta(engine.spec_by_batch, base))

    def autoscaling_stats(
        self, engine: EngineStats, sleep: SleepState | None = None
    ) -> dict[str, float]:
        """The replica's `record_autoscaling_stats` result (flat name -> float); `sleep`
        the engine's sleep state where idle sleep is on."""
        prompt, output, finished = self.mean_tokens()
        return encode_replica_stats(
            self.windows(),
            arrival_rate_rps=self.arrival_rate_rps(),
            recent_arrival_rate_rps=self.arrival_rate_rps(RECENT_WINDOW_S),
            mean_prompt_tokens=prompt,
            mean_output_tokens=output,
            finished_requests=finished,
            engine_running=engine.running,
            engine_waiting=engine.waiting,
            acceptance_by_batch=self.acceptance_by_batch(engine),
            replica_start_s=self.start_s,
            sleeping=None if sleep is None else sleep.sleeping,
            wake_s=None if sleep is None else sleep.wake_s,
            tpot_mean=self.tpot_mean(engine),
        )

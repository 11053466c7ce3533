"""The latency statistic the policy reads, computed by the same code live and simulated
(docs/autoscaling.md explains the choices).

`pooled_tenant_latency(windows)` turns per-replica latency windows into one `TenantLatency`
per tenant, for the Ray adapter (ray_policy.py) and the simulator
(agentserve_bench/autoscale/simulate.py) alike: the pooled nearest-rank p95 over all
replicas' samples on a log-bucketed histogram (buckets 5% wide, a value reported as its
bucket's upper edge; histograms because Ray Serve carries a flat `name -> float` per
replica, and they add exactly). Counts may be fractional: the rank is the first bucket whose
cumulative count reaches 95% of the total. `nearest_rank(values, q)` is the same rule on raw
samples; every percentile the benchmarks report uses it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agentserve.autoscale.policy_types import TenantLatency

__all__ = ["GROWTH", "LatencyWindow", "bucket_of", "bucket_upper_ms", "histogram"]
__all__ += ["nearest_rank", "p95_of_histogram", "pooled_p95", "pooled_tenant_latency", "tpot_ms"]

GROWTH = 1.05
"""Ratio between consecutive bucket edges (5% resolution)."""
MIN_MS = 1.0
"""Upper edge of bucket 0: every latency of 1 ms or less."""
_EPS = 1e-9


def tpot_ms(first_s: float | None, last_s: float | None, output_tokens: int) -> float | None:
    """Time per output token after the first, in ms: (last - first) / (tokens - 1); None
    below two tokens or without both times. Per output token, not per engine step (a
    speculative step emits several), and one definition for the replicas' published samples,
    the simulator's and the benchmarks', so the policy's TPOT means the same in each."""
    if first_s is None or last_s is None or output_tokens < 2:
        return None
    return 1000.0 * (last_s - first_s) / (output_tokens - 1)


def bucket_of(ms: float) -> int:
    """Index of the bucket holding `ms`: edges MIN_MS x GROWTH^i, upper edge inclusive."""
    if ms <= MIN_MS:
        return 0
    return max(0, math.ceil(math.log(ms / MIN_MS) / math.log(GROWTH) - _EPS))


def bucket_upper_ms(index: int) -> float:
    """The value a bucket reports: its upper edge."""
    return MIN_MS * GROWTH**index


def histogram(samples: Iterable[float]) -> dict[int, float]:
    """Bucket index -> count of `samples` (milliseconds)."""
    out: dict[int, float] = {}
    for v in samples:
        i = bucket_of(v)
        out[i] = out.get(i, 0.0) + 1.0
    return out


def _merge(histograms: Iterable[Mapping[int, float]]) -> dict[int, float]:
    out: dict[int, float] = {}
    for h in histograms:
        for i, n in h.items():
            out[i] = out.get(i, 0.0) + n
    return out


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    """The q-quantile (0 < q <= 1) of raw samples by nearest rank: the ceil(q N)-th
    smallest, a value some sample had (p95_of_histogram's rule); None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered) - _EPS) - 1)]


def p95_of_histogram(hist: Mapping[int, float]) -> float | None:
    """Nearest-rank p95 of a histogram (the upper edge of the bucket holding rank
    ceil(0.95 N)); None when empty."""
    total = sum(n for n in hist.values() if n > 0)
    if total <= 0:
        return None
    rank, seen = 0.95 * total, 0.0
    for i in sorted(hist):
        seen += max(0.0, hist[i])
        if seen >= rank - _EPS:
            return bucket_upper_ms(i)
    return bucket_upper_ms(max(hist))


def pooled_p95(windows: Iterable[Sequence[float]]) -> float | None:
    """Pooled p95 of per-replica sample lists (the statistic on raw samples)."""
    return p95_of_histogram(_merge(histogram(w) for w in windows))


@dataclass(frozen=True)
class LatencyWindow:
    """One replica's look-back window for one tenant, as bucket counts. `requests` counts
    the requests the window saw (finished plus open)."""

    ttft: Mapping[int, float] = field(default_factory=dict)
    tpot: Mapping[int, float] = field(default_factory=dict)
    requests: int = 0

    @classmethod
    def of(
        cls, ttft_ms: Iterable[float], tpot_ms: Iterable[float], requests: int | None = None
    ) -> LatencyWindow:
        """From raw samples; `requests` defaults to the number of TTFT samples."""
        ttft = histogram(ttft_ms)
        n = int(sum(ttft.values())) if requests is None else requests
        return cls(ttft, histogram(tpot_ms), n)


def pooled_tenant_latency(
    windows: Iterable[Mapping[str, LatencyWindow]],
) -> dict[str, TenantLatency]:
    """Per tenant, over every replica's window: pooled nearest-rank p95 TTFT and TPOT
    (None without samples) and the summed request count. This is the only place the
    policy's latency inputs are computed, live and in the simulator."""
    ttft: dict[str, list[Mapping[int, float]]] = {}
    tpot: dict[str, list[Mapping[int, float]]] = {}
    requests: dict[str, int] = {}
    for replica in windows:
        for name, w in replica.items():
            ttft.setdefault(name, []).append(w.ttft)
            tpot.setdefault(name, []).append(w.tpot)
            requests[name] = requests.get(name, 0) + w.requests
    return {
        name: TenantLatency(
            p95_of_histogram(_merge(ttft[name])),
            p95_of_histogram(_merge(tpot[name])),
            requests[name],
        )
        for name in sorted(requests)
    }

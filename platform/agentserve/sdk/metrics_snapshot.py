"""Read the ingress's Prometheus text (GET /metrics) into per model/tenant stats (pure).

Counters and histograms are cumulative since the ingress started; `MetricsSnapshot.minus`
gives the window between two scrapes (what `agentserve status --watch` shows). Quantiles
are estimated from histogram buckets the way Prometheus' histogram_quantile does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Histogram", "MetricsSnapshot", "parse_metrics"]

_PREFIX = "agentserve_"
_HISTOGRAMS = {
    "time_to_first_token_seconds": "ttft",
    "time_per_output_token_seconds": "tpot",
}
_TENANT_COUNTERS = {"prompt_tokens_total": "prompt_tokens", "output_tokens_total": "output_tokens"}
_MODEL_VALUES = {
    "requests_in_flight": "in_flight",
    "requests_queued": "queued",
    "engine_running_requests": "running",
    "engine_waiting_requests": "waiting",
    "spec_decode_drafts_total": "drafts",
    "spec_decode_draft_tokens_total": "draft_tokens",
    "spec_decode_accepted_tokens_total": "accepted_tokens",
    "spec_decode_acceptance_length": "acceptance_length",
}
_MODEL_COUNTERS = {"drafts", "draft_tokens", "accepted_tokens"}


@dataclass
class Histogram:
    """Cumulative bucket counts (upper bound -> observations <= bound), count and sum."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    total: float = 0.0

    def quantile(self, q: float) -> float | None:
        """Estimated q-quantile (linear within the bucket); None without observations.
        In the +Inf bucket it is the largest finite bound, as in Prometheus."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        finite = sorted(b for b in self.buckets if math.isfinite(b))
        for bound in finite:
            cumulative = self.buckets[bound]
            if cumulative >= rank:
                inside = cumulative - below
                frac = (rank - below) / inside if inside > 0 else 1.0
                return lower + (bound - lower) * frac
            lower, below = bound, cumulative
        return finite[-1] if finite else None

    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def minus(self, before: Histogram) -> Histogram:
        return Histogram(
            {b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()},
            self.count - before.count,
            self.total - before.total,
        )


@dataclass
class TenantStats:
    """One (model, tenant): latency histograms, request counts by HTTP status, tokens, and
    requests within the tenant's SLA by objective ("ttft", "tpot")."""

    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)
    requests: dict[str, float] = field(default_factory=dict)
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    within_sla: dict[str, float] = field(default_factory=dict)

    def minus(self, before: TenantStats) -> TenantStats:
        return TenantStats(
            self.ttft.minus(before.ttft),
            self.tpot.minus(before.tpot),
            {s: n - before.requests.get(s, 0.0) for s, n in self.requests.items()},
            self.prompt_tokens - before.prompt_tokens,
            self.output_tokens - before.output_tokens,
            {o: n - before.within_sla.get(o, 0.0) for o, n in self.within_sla.items()},
        )


@dataclass
class MetricsSnapshot:
    """tenants: (model, tenant) -> TenantStats; models: model -> {name: value} with the
    keys in_flight, queued, running, waiting, drafts, draft_tokens, accepted_tokens,
    acceptance_length (those exported); objectives: (tenant, "ttft" | "tpot") -> the p95
    objective in seconds."""

    tenants: dict[tuple[str, str], TenantStats] = field(default_factory=dict)
    models: dict[str, dict[str, float]] = field(default_factory=dict)
    objectives: dict[tuple[str, str], float] = field(default_factory=dict)

    def minus(self, before: MetricsSnapshot) -> MetricsSnapshot:
        """The window since `before`: counters and histograms subtract, gauges stay."""
        tenants = {
            key: stats.minus(before.tenants.get(key, TenantStats()))
            for key, stats in self.tenants.items()
        }
        models = {}
        for name, values in self.models.items():
            old = before.models.get(name, {})
            models[name] = {
                k: v - old.get(k, 0.0) if k in _MODEL_COUNTERS else v for k, v in values.items()
            }
        return MetricsSnapshot(tenants, models, dict(self.objectives))


def parse_metrics(text: str) -> MetricsSnapshot:
    """Prometheus text -> MetricsSnapshot; series this module does not know are ignored."""
    snap = MetricsSnapshot()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(_PREFIX):
                _add_sample(snap, sample.name[len(_PREFIX) :], sample.labels, sample.value)
    return snap


def _add_sample(snap: MetricsSnapshot, name: str, labels: dict[str, str], value: float) -> None:
    model = labels.get("model", "")
    if name in _MODEL_VALUES:
        snap.models.setdefault(model, {})[_MODEL_VALUES[name]] = value
        return
    if name == "sla_objective_seconds" and "tenant" in labels:
        snap.objectives[(labels["tenant"], labels.get("objective", ""))] = value
        return
    if "tenant" not in labels or "model" not in labels:
        return
    stats = snap.tenants.setdefault((model, labels["tenant"]), TenantStats())
    if name == "requests_total":
        stats.requests[labels.get("status", "")] = value
    elif name == "requests_within_sla_total":
        stats.within_sla[labels.get("objective", "")] = value
    elif name in _TENANT_COUNTERS:
        setattr(stats, _TENANT_COUNTERS[name], value)
    else:
        _add_histogram_sample(stats, name, labels, value)


def _add_histogram_sample(
    stats: TenantStats, name: str, labels: dict[str, str], value: float
) -> None:
    for base, attr in _HISTOGRAMS.items():
        if not name.startswith(base):
            continue
        hist: Histogram = getattr(stats, attr)
        suffix = name[len(base) :]
        if suffix == "_bucket":
            hist.buckets[float(labels["le"])] = value
        elif suffix == "_count":
            hist.count = value
        elif suffix == "_sum":
            hist.total = value

"""Prometheus metrics of one ingress: per model+tenant latency and tokens, per model queue
and speculative-decoding counters. Each ServingMetrics owns its registry (no globals).

TTFT counts from the moment the ingress accepted the request (queue time included).
Time per output token (TPOT) = (last token time - first token time) / (output tokens - 1),
per output token, not per engine step, so speculation shows up as lower TPOT.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agentserve.admission.shares import model_capacity
from agentserve.api.auth import OPEN_TENANT
from agentserve.engine.protocol import EngineStats
from agentserve.speculation.by_batch import bucket_counts
from agentserve.speculation.calibration import decisions_from_env

__all__ = ["CONTENT_TYPE", "ModelLimits", "ServingMetrics", "model_limits", "sla_objectives"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.5, 1)
_TENANT = ("model", "tenant")


class _EngineStatsCollector(Collector):
    """Exports the latest EngineStats snapshot per model at scrape time."""

    def __init__(self) -> None:
        self.snapshots: dict[str, EngineStats] = {}

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        counter, gauge, by = CounterMetricFamily, GaugeMetricFamily, "spec_decode_"
        rows = [  # key, kind, name after agentserve_, help, labels after model
            ("drafts", counter, by + "drafts", "Verify steps that carried a draft.", ()),
            ("draft_tokens", counter, by + "draft_tokens", "Tokens proposed by the drafter.", ()),
            ("accepted", counter, by + "accepted_tokens", "Drafted tokens accepted.", ()),
            ("length", gauge, by + "acceptance_length",
             "Mean tokens emitted per verify step since start (1 = no speculation).", ()),
            ("running", gauge, "engine_running_requests", "Requests in the engine batch.", ()),
            ("waiting", gauge, "engine_waiting_requests", "Requests queued in the engine.", ()),
            ("batch_drafts", counter, by + "batch_drafts",
             "Verify steps that carried a draft, by running batch size bucket.", ("batch",)),
            ("batch_accepted", counter, by + "batch_accepted_tokens",
             "Drafted tokens accepted, by running batch size bucket.", ("batch",)),
            ("batch_length", gauge, by + "batch_acceptance_length",
             "Mean tokens per verify step since start, by running batch size bucket.",
             ("batch",)),
            ("proposer_drafts", counter, by + "proposer_drafts",
             "Verify steps that carried a draft, by proposer (hybrid drafting).", ("proposer",)),
            ("proposer_draft_tokens", counter, by + "proposer_draft_tokens",
             "Tokens proposed, by proposer (hybrid drafting).", ("proposer",)),
            ("proposer_accepted", counter, by + "proposer_accepted_tokens",
             "Drafted tokens accepted, by proposer (hybrid drafting).", ("proposer",)),
            ("hybrid_steps", counter, by + "hybrid_steps",
             "Hybrid drafting steps: with DFlash's block forward (block), or with its "
             "context K/V only, prompt lookup drafting every request (context_only).",
             ("kind",)),
        ]  # fmt: skip
        families = {
            key: kind(f"agentserve_{name}", doc, labels=["model", *labels])
            for key, kind, name, doc, labels in rows
        }
        for model, s in sorted(self.snapshots.items()):
            families["drafts"].add_metric([model], s.spec_drafts)
            families["draft_tokens"].add_metric([model], s.spec_draft_tokens)
            families["accepted"].add_metric([model], s.spec_accepted_tokens)
            families["length"].add_metric([model], s.acceptance_length)
            families["running"].add_metric([model], s.running)
            families["waiting"].add_metric([model], s.waiting)
            for bucket, (drafts, _, accepted) in bucket_counts(s.spec_by_batch).items():
                families["batch_drafts"].add_metric([model, bucket], drafts)
                families["batch_accepted"].add_metric([model, bucket], accepted)
                families["batch_length"].add_metric([model, bucket], 1.0 + accepted / drafts)
            for proposer, drafts, drafted, accepted in s.spec_by_proposer:
                families["proposer_drafts"].add_metric([model, proposer], drafts)
                families["proposer_draft_tokens"].add_metric([model, proposer], drafted)
                families["proposer_accepted"].add_metric([model, proposer], accepted)
            for kind, steps in s.spec_steps:
                families["hybrid_steps"].add_metric([model, kind], steps)
        yield from families.values()


def sla_objectives(spec, tenants=None) -> dict[str, tuple[float, float]]:
    """tenant -> (TTFT, TPOT) p95 objectives in seconds for a DeploymentSpec (or for
    `tenants`, when given); without tenants, the open-mode tenant gets
    autoscaling.open_mode_sla."""
    tenants = spec.tenants if tenants is None else tenants
    slas = {t.name: t.sla for t in tenants} or {OPEN_TENANT: spec.autoscaling.open_mode_sla}
    return {name: s.seconds() for name, s in slas.items()}


class ModelLimits(NamedTuple):
    """What the alerts compare a model's live series with (all from the DeploymentSpec)."""

    capacity: int  # requests the ingress admits (running + queued) before answering 503
    min_replicas: int
    acceptance_floor: float | None  # drafter.min_acceptance_length; None = no speculation


def model_limits(spec) -> dict[str, ModelLimits]:
    """model -> ModelLimits for a DeploymentSpec (capacity: admission/shares.py)."""
    return {
        m.name: ModelLimits(
            model_capacity(m, spec.server.max_queue_len),
            m.replicas.min_replicas,
            m.drafter.min_acceptance_length if m.drafter.enabled else None,
        )
        for m in spec.models
    }


class ServingMetrics:
    """The ingress's metrics; `exposition()` renders Prometheus text."""

    def __init__(
        self,
        slas: Mapping[str, tuple[float, float]] | None = None,
        limits: Mapping[str, ModelLimits] | None = None,
    ) -> None:
        """`slas`: tenant -> (TTFT objective s, TPOT objective s), exported as
        agentserve_sla_objective_seconds and counted in agentserve_requests_within_sla.
        `limits`: model -> ModelLimits, exported for the alert rules to compare with."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.slas = dict(slas or {})
        self.requests = Counter(
            "agentserve_requests",
            "Finished requests by HTTP status.",
            [*_TENANT, "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "agentserve_time_to_first_token_seconds",
            "Ingress accept to first token.",
            _TENANT,
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.tpot = Histogram(
            "agentserve_time_per_output_token_seconds",
            "Mean seconds per output token after the first, one observation per request.",
            _TENANT,
            buckets=TPOT_BUCKETS_S,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "agentserve_prompt_tokens", "Prompt tokens.", _TENANT, registry=r
        )
        self.output_tokens = Counter(
            "agentserve_output_tokens", "Generated tokens.", _TENANT, registry=r
        )
        self.adapter_requests = Counter(
            "agentserve_adapter_requests",
            "Finished requests that named a LoRA adapter, by adapter and HTTP status.",
            [*_TENANT, "adapter", "status"],
            registry=r,
        )
        self.adapter_tokens = Counter(
            "agentserve_adapter_tokens",
            "Prompt and generated tokens (kind) of requests that named a LoRA adapter.",
            [*_TENANT, "adapter", "kind"],
            registry=r,
        )
        self.in_flight = Gauge(
            "agentserve_requests_in_flight",
            "Requests accepted and not finished.",
            ["model"],
            registry=r,
        )
        self.queued = Gauge(
            "agentserve_requests_queued",
            "Requests accepted that have no first token yet.",
            ["model"],
            registry=r,
        )
        self.within_sla = Counter(
            "agentserve_requests_within_sla",
            "Requests whose TTFT or TPOT (label objective) met the tenant's p95 objective; "
            "divided by the histogram's _count it is the SLA attainment (>= 0.95 meets it).",
            [*_TENANT, "objective"],
            registry=r,
        )
        self.sla_objective = Gauge(
            "agentserve_sla_objective_seconds",
            "The tenant's p95 latency objective (objective = ttft or tpot).",
            ["tenant", "objective"],
            registry=r,
        )
        self.set_slas(self.slas)
        self.replicas = Gauge(
            "agentserve_replicas_ready",
            "Replicas of the model serving now (per Serve's controller).",
            ["model"],
            registry=r,
        )
        self.migrations = Counter(
            "agentserve_migrations",
            "Re-issues of a request to another replica after its replica died mid-request.",
            ["model"],
            registry=r,
        )
        self.engine_up = Gauge(
            "agentserve_engine_up",
            "1 when the model's engine answered the ingress's last stats call in time, else 0.",
            ["model"],
            registry=r,
        )
        self._add_limits(dict(limits or {}))
        self._add_speculation_decisions(decisions_from_env())
        self._engine = _EngineStatsCollector()
        r.register(self._engine)

    def _add_limits(self, limits: dict[str, ModelLimits]) -> None:
        r = self.registry
        capacity = Gauge(
            "agentserve_requests_capacity",
            "Requests the ingress admits per model (running + queued) before answering 503.",
            ["model"],
            registry=r,
        )
        min_replicas = Gauge(
            "agentserve_replicas_min",
            "The model's configured min_replicas.",
            ["model"],
            registry=r,
        )
        floor = Gauge(
            "agentserve_spec_decode_acceptance_floor",
            "drafter.min_acceptance_length: mean tokens per verify step below which "
            "speculation has collapsed (only for models that speculate).",
            ["model"],
            registry=r,
        )
        for model, lim in limits.items():
            capacity.labels(model).set(lim.capacity)
            min_replicas.labels(model).set(lim.min_replicas)
            if lim.acceptance_floor is not None:
                floor.labels(model).set(lim.acceptance_floor)

    def _add_speculation_decisions(self, decisions: Mapping[str, Mapping]) -> None:
        """How `agentserve up` chose each model's speculation (speculation/calibration.py), as
        info-style gauges: the choice (value 1) and, where calibrated, its predicted speedup."""
        r = self.registry
        choice = Gauge(
            "agentserve_speculation_choice",
            "The model's speculative method, drafted tokens and dtype (value 1), and what "
            "decided them: served figures, calibration on this machine, or the spec.",
            ["model", "method", "k", "dtype", "decided_by", "machine"],
            registry=r,
        )
        predicted = Gauge(
            "agentserve_speculation_predicted_speedup",
            "Decode speedup over plain decoding at batch 1 that calibration predicted.",
            ["model"],
            registry=r,
        )
        for model, d in decisions.items():
            labels = [d.get(x) for x in ("method", "k", "dtype", "decided_by", "machine")]
            choice.labels(model, *(str(x) for x in labels)).set(1)
            if d.get("predicted_speedup") is not None:
                predicted.labels(model).set(float(d["predicted_speedup"]))

    def set_slas(self, slas: Mapping[str, tuple[float, float]]) -> None:
        """Replace the tenants' objectives (a tenant update); gone tenants' series go."""
        for tenant in set(self.slas) - set(slas):
            for objective in ("ttft", "tpot"):
                with contextlib.suppress(KeyError):
                    self.sla_objective.remove(tenant, objective)
        self.slas = dict(slas)
        for tenant, (ttft_s, tpot_s) in self.slas.items():
            self.sla_objective.labels(tenant, "ttft").set(ttft_s)
            self.sla_objective.labels(tenant, "tpot").set(tpot_s)

    def observe_request(
        self,
        model: str,
        tenant: str,
        *,
        ttft_s: float | None,
        decode_s: float | None,
        prompt_tokens: int,
        output_tokens: int,
        status: int,
        adapter: str | None = None,
    ) -> None:
        """Record one finished request. `decode_s` = last token time - first token time;
        `adapter`: the LoRA adapter it named, counted also by adapter (the other series
        count it under its base model)."""
        self.requests.labels(model, tenant, str(status)).inc()
        if adapter is not None:
            self.adapter_requests.labels(model, tenant, adapter, str(status)).inc()
            self.adapter_tokens.labels(model, tenant, adapter, "prompt").inc(prompt_tokens)
            self.adapter_tokens.labels(model, tenant, adapter, "output").inc(output_tokens)
        ttft_slo, tpot_slo = self.slas.get(tenant, (None, None))
        if ttft_s is not None:
            self.ttft.labels(model, tenant).observe(ttft_s)
            if ttft_slo is not None and ttft_s <= ttft_slo:
                self.within_sla.labels(model, tenant, "ttft").inc()
        if decode_s is not None and output_tokens > 1:
            tpot_s = decode_s / (output_tokens - 1)
            self.tpot.labels(model, tenant).observe(tpot_s)
            if tpot_slo is not None and tpot_s <= tpot_slo:
                self.within_sla.labels(model, tenant, "tpot").inc()
        self.prompt_tokens.labels(model, tenant).inc(prompt_tokens)
        self.output_tokens.labels(model, tenant).inc(output_tokens)

    def set_engine_stats(self, model: str, stats: EngineStats) -> None:
        """Replace the engine snapshot exported for `model`."""
        self._engine.snapshots[model] = stats

    def exposition(self) -> bytes:
        """Prometheus text format of everything in this registry."""
        return generate_latest(self.registry)

"""The Grafana dashboard queries only what the platform exports: every metric a panel or
variable names is a sample of ServingMetrics' registry (rendered after one request and one
engine snapshot), and every label it filters or groups by exists on those samples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from agentserve.engine.protocol import EngineStats
from agentserve.serve.metrics import ServingMetrics
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[4]
DASHBOARD = ROOT / "helm" / "agentserve" / "files" / "dashboards" / "agentserve.json"
SELECTOR = re.compile(r"\b(agentserve_[a-z0-9_]+)(?:\{([^}]*)\})?")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER_KEY = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def exported_samples() -> dict[str, set[str]]:
    """sample name -> label names, from a registry that has seen some traffic."""
    metrics = ServingMetrics({"gold": (1.0, 0.1)})
    metrics.observe_request(
        "m", "gold", ttft_s=0.2, decode_s=0.5, prompt_tokens=5, output_tokens=11, status=200
    )
    stats = EngineStats(
        running=1,
        waiting=1,
        spec_drafts=10,
        spec_draft_tokens=40,
        spec_accepted_tokens=15,
        spec_by_batch=((1, 10, 40, 15),),
        spec_by_proposer=(("dflash", 4, 12, 3), ("ngram", 6, 28, 12)),
    )
    metrics.set_engine_stats("m", stats)
    metrics.replicas.labels("m").set(1)
    metrics.in_flight.labels("m").inc()  # as the ingress does on admission
    metrics.queued.labels("m").inc()
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def queries() -> list[str]:
    """Every PromQL expression in the dashboard: panel targets and variable queries."""
    board = json.loads(DASHBOARD.read_text())
    panels = list(board["panels"])
    for panel in board["panels"]:
        panels.extend(panel.get("panels", []))
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        if var.get("type") == "query":
            exprs.append(var["definition"])
    return exprs


def test_dashboard_has_the_panels_the_issue_asks_for():
    text = " ".join(queries())
    for needed in (
        "agentserve_time_to_first_token_seconds_bucket",
        "agentserve_time_per_output_token_seconds_bucket",
        "agentserve_requests_within_sla_total",
        "agentserve_output_tokens_total",
        "agentserve_spec_decode_acceptance_length",
        "agentserve_replicas_ready",
        "agentserve_requests_queued",
    ):
        assert needed in text


@pytest.mark.parametrize("expr", queries())
def test_every_query_names_exported_metrics_and_labels(expr):
    samples = exported_samples()
    selectors = SELECTOR.findall(expr)
    assert selectors, f"no agentserve metric in {expr!r}"
    labels: set[str] = set()
    for name, matchers in selectors:
        assert name in samples, f"{name} is not exported (have {sorted(samples)})"
        keys = set(MATCHER_KEY.findall(matchers))
        assert keys <= samples[name], f"{name} has no label(s) {keys - samples[name]}"
        labels |= samples[name]
    for group in GROUPING.findall(expr):
        wanted = {g.strip() for g in group.split(",") if g.strip()}
        assert wanted <= labels, f"grouping by {wanted - labels} in {expr!r}"


def test_snapshot_keeps_only_model_tenant_series():
    """The SLA objective gauge (tenant, no model) must not become a phantom model row."""
    from agentserve.sdk.metrics_snapshot import parse_metrics

    metrics = ServingMetrics({"gold": (1.0, 0.1)})
    metrics.observe_request(
        "m", "gold", ttft_s=0.2, decode_s=0.5, prompt_tokens=5, output_tokens=11, status=200
    )
    snap = parse_metrics(metrics.exposition().decode())
    assert set(snap.tenants) == {("m", "gold")}


def test_hybrid_drafting_exports_acceptance_by_proposer():
    text = ServingMetrics({}).exposition  # registry without a snapshot: no proposer series
    assert "proposer=" not in text().decode()
    metrics = ServingMetrics({})
    metrics.set_engine_stats(
        "m", EngineStats(spec_by_proposer=(("dflash", 4, 12, 3), ("ngram", 6, 28, 12)))
    )
    page = metrics.exposition().decode()
    assert 'agentserve_spec_decode_proposer_drafts_total{model="m",proposer="ngram"} 6.0' in page
    assert (
        'agentserve_spec_decode_proposer_accepted_tokens_total{model="m",proposer="dflash"} 3.0'
        in page
    )
    assert (
        'agentserve_spec_decode_proposer_draft_tokens_total{model="m",proposer="ngram"} 28.0'
        in page
    )
    assert "agentserve_spec_decode_hybrid_steps_total{" not in page  # no steps: no samples
    metrics.set_engine_stats("m", EngineStats(spec_steps=(("block", 5), ("context_only", 3))))
    page = metrics.exposition().decode()
    steps = 'agentserve_spec_decode_hybrid_steps_total{kind="context_only",model="m"} 3.0'
    assert steps in page

"""`agentserve status`'s per-tenant SLA view: attainment and error-budget burn rate from
the ingress's objective gauge and within-SLA counters, with the alert rules' formula."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml
from agentserve.cli.console import Console
from agentserve.cli.status import (
    FAST_BURN,
    SLA_BUDGET,
    SLOW_BURN,
    Report,
    burn_rate,
    render,
    report_rows,
    sla_rows,
    sla_state,
)
from agentserve.sdk.metrics_snapshot import parse_metrics
from agentserve.serve.metrics import ServingMetrics

ROOT = Path(__file__).resolve().parents[4]
RULES = ROOT / "helm" / "agentserve" / "files" / "alerts" / "agentserve.rules.yaml"


def traffic() -> ServingMetrics:
    """gold (TTFT 0.5 s, TPOT 0.05 s) on two models, silver (0.2 s, 0.02 s) idle."""
    metrics = ServingMetrics({"gold": (0.5, 0.05), "silver": (0.2, 0.02)})
    # (model, ttft_s, decode_s over 11 tokens -> tpot = decode_s / 10)
    for model, ttft, decode in [
        ("a", 0.1, 0.3),  # both within
        ("a", 0.9, 0.3),  # TTFT missed
        ("b", 0.2, 0.9),  # TPOT missed (0.09 s)
        ("b", 0.3, 0.2),  # both within
    ]:
        metrics.observe_request(
            model, "gold", ttft_s=ttft, decode_s=decode, prompt_tokens=3, output_tokens=11,
            status=200,
        )  # fmt: skip
    return metrics


@pytest.mark.parametrize(
    ("measured", "within", "expected"),
    [
        (100, 95, 1.0),  # exactly the 5% budget
        (100, 100, 0.0),
        (100, 0, 20.0),  # everything missed: 1 / 0.05
        (4, 3, 5.0),
        (0, 0, None),  # nothing measured: unknown, not "ok"
    ],
)
def test_burn_rate_table(measured, within, expected):
    got = burn_rate(measured, within)
    assert got == pytest.approx(expected) if expected is not None else got is None


@pytest.mark.parametrize(
    ("burns", "state"),
    [
        ([0.5, None], "ok"),
        ([1.0, 0.2], "ok"),
        ([1.5, 0.2], "over-budget"),
        ([0.0, 6.5], "slow-burn"),
        ([20.0, 0.0], "fast-burn"),
        ([None, None], "-"),
    ],
)
def test_sla_state_table(burns, state):
    assert sla_state(burns) == state


def test_snapshot_reads_objectives_and_within_counts():
    snap = parse_metrics(traffic().exposition().decode())
    assert snap.objectives == {
        ("gold", "ttft"): 0.5,
        ("gold", "tpot"): 0.05,
        ("silver", "ttft"): 0.2,
        ("silver", "tpot"): 0.02,
    }
    assert snap.tenants[("a", "gold")].within_sla == {"ttft": 1.0, "tpot": 2.0}
    assert snap.tenants[("b", "gold")].within_sla == {"ttft": 2.0, "tpot": 1.0}


def test_sla_rows_sum_models_per_tenant():
    rows = sla_rows(parse_metrics(traffic().exposition().decode()))
    assert rows == [
        # 3 of 4 within each objective: 75%, burn 0.25 / 0.05 = 5
        ("gold", 4, 500.0, 75.0, 5.0, 50.0, 75.0, 5.0, "over-budget"),
        ("silver", 0, 200.0, None, None, 20.0, None, None, "-"),
    ]


def test_sla_rows_of_a_window_count_only_its_requests():
    metrics = traffic()
    before = parse_metrics(metrics.exposition().decode())
    for _ in range(2):  # two more, both within
        metrics.observe_request(
            "a", "gold", ttft_s=0.1, decode_s=0.1, prompt_tokens=1, output_tokens=3, status=200
        )
    window = parse_metrics(metrics.exposition().decode()).minus(before)
    [gold, _] = sla_rows(window)
    assert gold == ("gold", 2, 500.0, 100.0, 0.0, 50.0, 100.0, 0.0, "ok")


def test_status_shows_the_sla_table_and_records():
    snap = parse_metrics(traffic().exposition().decode())
    report = Report("http://h:1", {"status": "ok"}, None, snap)
    out = io.StringIO()
    render(Console(out, plain=False, environ={"NO_COLOR": "1"}), report, report_rows(report), "x")
    assert "TTFT_ATTAINED_PCT" in out.getvalue() and "over-budget" in out.getvalue()
    out = io.StringIO()
    render(Console(out, plain=True, environ={}), report, report_rows(report), "x")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    [gold] = [r for r in records if r["kind"] == "sla" and r["tenant"] == "gold"]
    assert gold["ttft_burn"] == 5.0 and gold["tpot_slo_ms"] == 50.0


def test_budget_and_thresholds_are_the_alert_rules():
    """Status and the alerts must agree: same budget, same burn thresholds."""
    rules = yaml.safe_load(RULES.read_text())
    burn = [r for g in rules["groups"] for r in g["rules"] if "BurnRate" in r.get("alert", "")]
    assert len(burn) == 4
    for rule in burn:
        [budget] = set(re.findall(r"/ ([0-9.]+) >", rule["expr"]))
        [threshold] = set(re.findall(r"> ([0-9.]+)", rule["expr"]))
        assert float(budget) == SLA_BUDGET
        expected = FAST_BURN if rule["alert"].endswith("Fast") else SLOW_BURN
        assert float(threshold) == expected

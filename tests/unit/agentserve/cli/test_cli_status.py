"""`agentserve status` without a server: metrics parsing, quantiles, rows, both outputs."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from agentserve.cli.console import Console
from agentserve.cli.status import Report, render, report_rows
from agentserve.engine.protocol import EngineStats
from agentserve.sdk.metrics_snapshot import Histogram, parse_metrics
from agentserve.serve.metrics import ServingMetrics
from agentserve.serve.status import status_dict


def _exposition(requests: list[tuple[float, float, int, int]]) -> str:
    """(ttft_s, decode_s, output_tokens, status) per request for model m, tenant t."""
    metrics = ServingMetrics()
    for ttft, decode, tokens, status in requests:
        metrics.observe_request(
            "m",
            "t",
            ttft_s=ttft,
            decode_s=decode,
            prompt_tokens=5,
            output_tokens=tokens,
            status=status,
        )
    metrics.set_engine_stats(
        "m", EngineStats(running=2, spec_drafts=10, spec_draft_tokens=70, spec_accepted_tokens=25)
    )
    return metrics.exposition().decode()


@pytest.mark.parametrize(
    ("buckets", "count", "q", "expected"),
    [
        ({0.1: 0, 0.2: 10, float("inf"): 10}, 10, 0.5, 0.15),  # linear inside (0.1, 0.2]
        ({0.1: 10, float("inf"): 10}, 10, 0.95, 0.095),  # first bucket starts at 0
        ({0.1: 0, float("inf"): 4}, 4, 0.5, 0.1),  # +Inf bucket: largest finite bound
        ({0.1: 0}, 0, 0.5, None),  # no observations
    ],
)
def test_histogram_quantile_table(buckets, count, q, expected):
    got = Histogram(buckets, count, 0.0).quantile(q)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_parse_metrics_reads_the_ingress_exposition():
    snap = parse_metrics(_exposition([(0.04, 0.9, 10, 200), (0.2, 0.0, 0, 429)]))
    stats = snap.tenants[("m", "t")]
    assert stats.requests == {"200": 1.0, "429": 1.0}
    assert stats.ttft.count == 2 and stats.tpot.count == 1
    assert stats.tpot.mean() == pytest.approx(0.1)  # 0.9 s over 9 tokens after the first
    assert stats.output_tokens == 10 and stats.prompt_tokens == 10
    assert snap.models["m"]["running"] == 2
    assert snap.models["m"]["acceptance_length"] == pytest.approx(3.5)


def test_window_subtracts_counters_and_keeps_gauges():
    before = parse_metrics(_exposition([(0.04, 0.9, 10, 200)]))
    now = parse_metrics(_exposition([(0.04, 0.9, 10, 200), (0.3, 0.45, 10, 200)]))
    window = now.minus(before)
    stats = window.tenants[("m", "t")]
    assert stats.ttft.count == 1 and stats.ttft.quantile(0.5) > 0.25
    assert window.models["m"]["drafts"] == 0 and window.models["m"]["running"] == 2


def _report() -> Report:
    status = SimpleNamespace(
        applications={
            "agentserve": SimpleNamespace(
                status=SimpleNamespace(value="RUNNING"),
                message="",
                deployments={
                    "model-m": SimpleNamespace(
                        status="UPDATING",
                        replica_states={"RUNNING": 1, "STARTING": 1},
                        message="Upscaling from 1 to 2 replicas.\nmore",
                    )
                },
            )
        },
        proxies={"node": "HEALTHY"},
    )
    return Report(
        "http://h:1",
        {"status": "ok", "models": {"m": "ok"}},
        status_dict(status),
        parse_metrics(_exposition([(0.04, 0.9, 10, 200), (0.2, 0.0, 0, 429)])),
    )


def test_rows_from_status_health_and_metrics():
    rows = report_rows(_report())
    assert rows["deployment"] == [
        (
            "agentserve",
            "model-m",
            "UPDATING",
            "1 RUNNING, 1 STARTING",
            "Upscaling from 1 to 2 replicas.",
        )
    ]
    # in_flight/queued are only exported once the ingress admitted a request
    assert rows["model"][0][:9] == ("m", "ok", None, None, 2, 0, 3.5, 25, 70)
    (latency,) = rows["latency"]
    assert latency[:4] == ("m", "t", 2, 1)
    assert latency[4] is not None and latency[6] == pytest.approx(100.0, rel=0.3)


def test_rows_tolerate_a_server_without_status_or_metrics():
    rows = report_rows(Report("http://h:1", None, None, parse_metrics("")))
    assert rows == {"deployment": [], "model": [], "latency": [], "sla": []}


def test_render_plain_is_one_json_object_per_line():
    out = io.StringIO()
    report = _report()
    render(Console(out, plain=True, environ={}), report, report_rows(report), "lifetime")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["kind"] for r in records] == ["server", "deployment", "model", "latency"]
    assert records[2]["acceptance_length"] == 3.5 and records[3]["tenant"] == "t"


def test_render_human_has_the_three_tables():
    out = io.StringIO()
    report = _report()
    render(Console(out, plain=False, environ={"NO_COLOR": "1"}), report, report_rows(report), "x")
    text = out.getvalue()
    for header in ("DEPLOYMENT", "ACCEPTANCE_LENGTH", "TTFT_P95_MS"):
        assert header in text
    assert text.startswith("agentserve at http://h:1: ok\n")


def test_speedup_estimate_divides_tau_by_the_step_cost_of_drafting():
    from agentserve.autoscale.model import LatencyModel
    from agentserve.cli.status import speedup_estimate

    m = LatencyModel()
    values = {"drafts": 10, "draft_tokens": 70, "accepted_tokens": 25, "running": 2}
    expected = 3.5 * m.step_ms(2, 0) / m.step_ms(2, 7)
    assert speedup_estimate(values) == pytest.approx(expected, abs=0.01)
    assert speedup_estimate({**values, "accepted_tokens": 0}) < 1.0  # drafting that never pays
    assert speedup_estimate({"drafts": 0}) is None
    report = _report()
    (row,) = report_rows(report)["model"]
    assert row[-1] == pytest.approx(expected, abs=0.01)


def test_the_servers_machine_is_shown():
    report = _report()
    machine = {
        "model": "AMD EPYC",
        "cores": 2,
        "features": ["avx2"],
        "cpu_class": "avx2",
    }
    report.status = {**(report.status or {}), "machine": machine}
    plain, human = io.StringIO(), io.StringIO()
    render(Console(plain, plain=True, environ={}), report, report_rows(report), "lifetime")
    assert json.loads(plain.getvalue().splitlines()[0])["machine"] == machine
    render(Console(human, plain=False, environ={}), report, report_rows(report), "lifetime")
    assert "machine: AMD EPYC, 2 cores, avx2 (no bf16 instructions) (avx2)" in human.getvalue()

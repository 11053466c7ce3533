"""The live run's scale-up replicas as startup.json rows: the decision from the policy's log
line, STARTING and RUNNING from the timeline, the first token from the first request after
it; written beside the startup benchmark's rows, which keep theirs."""

from __future__ import annotations

import json
import time
from datetime import datetime

from agentserve_bench.autoscale.live_scale_up import (
    decision_times,
    record_scale_ups,
    scale_up_episodes,
    scale_up_rows,
)
from agentserve_bench.autoscale.measured_start import scale_up_start_s
from agentserve_bench.startup import startup_section

T0 = time.mktime(datetime(2026, 11, 27, 10, 44, 0).timetuple())  # the phase's wall start


def _log(second: float, frm: int, to: int) -> str:
    stamp = datetime.fromtimestamp(T0 + second).strftime("%Y-%m-%d %H:%M:%S")
    millis = round((second % 1) * 1000)
    return (
        f"INFO {stamp},{millis:03d} controller 22810 -- agentserve policy: {frm} -> {to} "
        "replicas (burst_floor; sla ratio 0.26, floor 2, replica start 60.1 s)"
    )


def _point(t, running, **states):
    return {"t_s": t, "running": running, "states": {"RUNNING": running, **states}}


PHASE = {
    "t0_wall": T0,
    "timeline": [
        _point(0.0, 1),
        _point(19.8, 1, STARTING=1),
        _point(48.7, 2),
        _point(170.3, 1, STOPPING=1),
        _point(174.9, 1),
        _point(180.0, 1, STARTING=1),
        _point(200.0, 2),
    ],
    "policy_decisions": [_log(19.2, 1, 2), _log(150.5, 2, 1), _log(179.5, 1, 2)],
    "records": [
        {"arrival_s": 48.0, "ttft_ms": 900.0},  # sent before RUNNING: not the new replica's
        {"arrival_s": 49.5, "ttft_ms": None},  # failed: no first token
        {"arrival_s": 52.9, "ttft_ms": 120.0},
        {"arrival_s": 49.6, "ttft_ms": 300.0},  # records are in any order
    ],
}


def test_decisions_are_the_scale_up_lines_in_wall_clock_seconds():
    lines = [*PHASE["policy_decisions"], "INFO something else"]
    assert [round(t - T0, 2) for t in decision_times(lines)] == [19.2, 179.5]


def test_each_scale_up_is_timed_from_its_decision():
    first, second = scale_up_episodes(PHASE)
    assert round(first["decision_s"], 2) == 19.2
    assert (first["starting_s"], first["running_s"]) == (19.8, 48.7)
    assert first["ttft_s"] == 0.3  # the request sent at 49.6 s, after RUNNING
    assert round(second["decision_s"], 2) == 179.5 and second["ttft_s"] is None
    rows = scale_up_rows({"phases": {"on": PHASE}}, {"engine": "vllm", "compile": "compiled"})
    assert rows[0]["ready_s"] == 29.5 and rows[0]["first_token_s"] == 29.8
    assert rows[0]["phases"] == {"to_starting": 0.6, "starting_to_ready": 28.9, "first_token": 0.3}
    assert rows[0]["from"] == "decision" and rows[0]["live_phase"] == "priority on, scale-up 1"
    assert rows[1]["first_token_s"] is None and "first_token" not in rows[1]["phases"]


def test_without_a_logged_decision_the_start_counts_from_starting():
    untimed = {k: v for k, v in PHASE.items() if k != "t0_wall"}  # a report from before
    for phase in ({**PHASE, "policy_decisions": []}, untimed):
        row = scale_up_rows({"phases": {"off": phase}}, {})[0]
        assert row["from"] == "starting" and row["ready_s"] == 28.9
        assert row["phases"]["to_starting"] == 0.0


def test_the_rows_join_the_startup_records_and_the_simulator_reads_them(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks.md").write_text("x\n<!-- startup:begin -->\n<!-- startup:end -->\n")
    machine = {"cpu_class": "avx512_bf16"}
    restart = {"kind": "restart", "compile": "compiled", "ready_s": 28.8, "phases": {},
               "machine": machine, "engine": "vllm"}  # fmt: skip
    stale = {"kind": "scale_up", "compile": "compiled", "ready_s": 77.0, "machine": machine,
             "engine": "vllm"}  # fmt: skip
    path = tmp_path / "benchmarks" / "startup.json"
    path.write_text(json.dumps([restart, stale]))
    common = {"engine": "vllm", "compile": "compiled", "date": "2026-11-27", "machine": machine}
    rows = scale_up_rows({"phases": {"on": PHASE}}, common)
    record_scale_ups(rows, "avx512_bf16", tmp_path)
    kept = json.loads(path.read_text())
    assert [r["kind"] for r in kept] == ["restart", "scale_up", "scale_up"]  # stale one gone
    assert scale_up_start_s(kept) == 29.5  # a measured scale-up before a restart
    text = (tmp_path / "benchmarks.md").read_text()
    row = "| avx512_bf16 | compiled | priority on, scale-up 1 | 2026-11-27 | 29.5 | 0.6 | 28.9"
    assert row in text
    assert text == "x\n<!-- startup:begin -->\n" + startup_section(kept) + "<!-- startup:end -->\n"


def test_report_only_rewrites_the_scale_up_rows_from_the_saved_report(tmp_path, capsys):
    """`agentserve bench autoscale-live --report-only`: the saved report's summary, and its
    scale-ups in the startup.json beside it, labelled with the machine that ran it."""
    from agentserve.cli import main

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks.md").write_text("<!-- startup:begin -->\n<!-- startup:end -->\n")
    tenant = {"requests": 1, "attainment": 1.0, "attainment_outside_burst": 1.0,
              "attainment_in_burst": None, "ttft_p50_ms": 1, "ttft_p95_ms": 1,
              "tpot_p50_ms": 1, "tpot_p95_ms": 1, "statuses": {"200": 1}}  # fmt: skip
    phase = {**PHASE, "tenants": {"interactive": tenant}, "scaled_1_2_1": True,
             "scale_up_s": 28.9, "replica_seconds": 400.0, "replay_s": 210.0}  # fmt: skip
    machine = {"cpu_class": "arm", "model": "test", "features": []}
    report = {"config": {"engine": "vllm"}, "command": "agentserve bench autoscale-live",
              "phases": {"on": phase},
              "machine": {"date": "2026-11-20 10:00:00 UTC", "cpu_info": machine}}  # fmt: skip
    out = tmp_path / "benchmarks" / "autoscale_live.json"
    out.write_text(json.dumps(report))
    assert main(["bench", "autoscale-live", "--report-only", "--out", str(out)]) == 0
    assert "ready 29.5 s, first token 29.8 s after the decision" in capsys.readouterr().out
    rows = json.loads((tmp_path / "benchmarks" / "startup.json").read_text())
    assert [(r["machine"]["cpu_class"], r["date"]) for r in rows] == [("arm", "2026-11-20")] * 2

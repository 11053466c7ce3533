"""`agentserve bench startup`: vLLM's phase lines, the compile/eager rule, the records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from agentserve import profiles
from agentserve.engine.start_phases import log_phases
from agentserve_bench.startup import _modes, compile_choice

DOCS = Path(__file__).resolve().parents[3] / "docs"

LOG = """
(Worker pid=2) INFO 11-26 10:17:19 [default_loader.py:501] Loading weights took 0.24 seconds
(Worker pid=2) INFO 11-26 10:17:20 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=2) INFO 11-26 10:18:38 [cpu_model_runner.py:91] Warming up done.
(EngineCore pid=1) INFO 11-26 10:18:40 [core.py:402] init engine (profile, create kv cache, \
warmup model) took 79.00 s
(EngineCore pid=1) INFO 11-26 10:18:41 [core.py:402] init engine (profile, create kv cache, \
warmup model) took 80.87 s
"""


def test_log_phases_reads_vllms_own_figures_last_wins():
    assert log_phases(LOG) == {"weights_load": 0.24, "compile": 78.0, "engine_init": 80.87}
    assert log_phases("nothing here") == {}


def _rows(eager_decode: float, eager_ready: float) -> list[dict]:
    rows = []
    for mode, decode, ready in (("compiled", 20.0, 200.0), ("eager", eager_decode, eager_ready)):
        rows += [
            {"kind": "first_start", "compile": mode, "ready_s": ready + 10},
            {"kind": "restart", "compile": mode, "ready_s": ready - 10},
            {"kind": "served", "compile": mode, "decode_tokens_per_s": decode},
        ]
    return rows


@pytest.mark.parametrize(
    ("eager_decode", "eager_ready", "compiles"),
    [
        (19.5, 40.0, False),  # 0.975x and much sooner: eager
        (18.0, 40.0, True),  # 0.90x: a start is paid once, decode always
        (21.0, 250.0, True),  # faster decode but slower to start: still compile
    ],
)
def test_compile_choice_rule(eager_decode, eager_ready, compiles):
    choice = compile_choice(_rows(eager_decode, eager_ready))
    assert choice["compile"] is compiles
    assert choice["eager_decode_ratio"] == round(eager_decode / 20.0, 3)
    assert choice["ready_s_mean"]["compiled"] == 200.0


def test_compile_choice_needs_both_modes():
    rows = [r for r in _rows(19.5, 40.0) if r["compile"] == "compiled"]
    assert compile_choice(rows) is None


def test_modes_argument():
    assert _modes("eager") == ["eager"]
    with pytest.raises(argparse.ArgumentTypeError):
        _modes("jit")


def test_compile_by_cpu_follows_the_committed_startup_runs():
    """Each kind of CPU's profile holds the compile choice its startup run recorded, and
    a kind never measured has none (that kind compiles, as vLLM does)."""
    rows = json.loads((DOCS / "benchmarks" / "startup.json").read_text())
    choices = {r["machine"]["cpu_class"]: r["compile"] for r in rows if r["kind"] == "choice"}
    assert choices, "no choice rows in docs/benchmarks/startup.json"
    profiled = {
        p.stem: profiles.load_profile(p).value("compile")
        for p in profiles.PROFILE_DIR.glob("*.json")
        if profiles.load_profile(p).compile is not None
    }
    assert choices == profiled
    for r in rows:  # each choice is the rule applied to its own run's rows
        if r["kind"] == "choice":
            run = [x for x in rows if x["command"] == r["command"] and x["date"] == r["date"]]
            assert compile_choice(run)["compile"] == r["compile"]


def test_startup_section_lists_every_start_with_its_served_figures_and_the_choice():
    from agentserve_bench.startup import startup_section

    machine = {"cpu_class": "amx", "model": "Xeon"}
    common = {"machine": machine, "command": "agentserve bench startup", "date": "2026-11-26"}
    rows = [{**r, **common, "phases": {"ray_up": 3.0, "compile": 70.0}} for r in _rows(19.5, 40)]
    for r in rows:
        if r["kind"] == "served":
            r["ttft_ms_p50"] = 120.0
    rows.append({**compile_choice(rows), **common})
    text = startup_section(rows)
    starts = [line for line in text.splitlines() if line.startswith("| amx |")]
    assert len(starts) == 4  # first start and restart, per mode
    assert "| amx | eager | first_start | 50 | 3.0 | - | - | 70.0 |" in text
    assert "| 19.5 | 120.0 |" in text  # served figures beside the first start
    assert "-> **eager**" in text


def test_bench_startup_report_only_through_the_cli(tmp_path):
    """`agentserve bench startup --report-only` rewrites the docs section from the rows."""
    import shutil

    from agentserve.cli import main

    (tmp_path / "benchmarks").mkdir()
    shutil.copy(DOCS / "benchmarks" / "startup.json", tmp_path / "benchmarks" / "startup.json")
    assert main(["bench", "startup", "--report-only", "--docs", str(tmp_path)]) == 0
    text = (tmp_path / "benchmarks.md").read_text()
    assert "<!-- startup:begin -->" in text and "| compiled | restart |" in text

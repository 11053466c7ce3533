"""`agentserve up`'s default speculation for the bundled model follows the committed served
figures (`agentserve bench speculative-served`, the "path": "served" rows of
docs/benchmarks/speculative.json), per kind of machine: a new run that changes the winner
fails here until the kind of machine's profile (agentserve/profiles, written by the
bench) follows it, and a kind of machine
without served figures gets plain decoding. Only rows of the workloads' tuning half decide
(and rows measured before the split, which carry no half): served_rows._deciding never
reads a "report" row, which is what docs/benchmarks.md reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentserve import profiles
from agentserve.drafters import (
    default_dtype,
    default_speculation,
    default_speculation_reason,
    default_speculation_tokens,
)
from agentserve.sources.models import BUNDLED_MODEL
from agentserve_bench.served_rows import deciding as served_deciding
from agentserve_bench.served_rows import rows_of_shipped_drafter, served_default, settings_scores
from agentserve_bench.settings_bundles import default_settings

FIGURES = Path(__file__).resolve().parents[3] / "docs" / "benchmarks" / "speculative.json"


def _served_by_machine() -> dict[str, list[dict]]:
    if not FIGURES.is_file():
        pytest.fail(f"{FIGURES} is missing: run `agentserve bench speculative-served`")
    out: dict[str, list[dict]] = {}
    for r in rows_of_shipped_drafter(json.loads(FIGURES.read_text())):
        if r.get("path") == "served":
            out.setdefault(r["machine"]["cpu_class"], []).append(r)
    return out


def test_there_are_served_figures_to_choose_from():
    served = _served_by_machine()
    assert served, "no served rows: run `agentserve bench speculative-served`"
    for rows in served.values():
        deciding = [r for r in rows if r["server"] == "agentserve"
                    and r["settings"] == default_settings(r["machine"]["cpu_class"])
                    and r.get("half") != "report"]  # fmt: skip
        # the reporting half never decides: what the docs quote was not tuned on
        assert not [r for r in rows if r.get("half") == "report" and served_deciding(r)]
        # two workloads at least: coding and agent (rows from before the halves), or the
        # tuning half of write, edit and explain where a kind was measured again
        assert len({r["workload"] for r in deciding}) >= 2
        assert {r["concurrency"] for r in deciding} >= {1, 4}
        assert {r["method"] for r in deciding} >= {"none", "ngram"}


def test_default_engine_settings_serve_fastest_in_their_run():
    """Among the settings bundles measured in the same run as the default one, the default
    gives the shortest reply (TTFT + decode) with its own best method."""
    for machine, rows in _served_by_machine().items():
        default = default_settings(machine)
        default_run = {
            r["command"] for r in rows if r["settings"] == default and r["server"] == "agentserve"
        }  # (vLLM's own server is the peer line, and may come from an earlier run)
        assert len(default_run) == 1, f"{machine}: default settings measured in several runs"
        scores = settings_scores(r for r in rows if r["command"] in default_run)
        best = min(scores, key=lambda name: scores[name]["reply_s"])
        assert best == default, (
            f"on {machine} {best} serves fastest ({scores}); update "
            "the engine section of agentserve/profiles/<cpu_class>.json"
        )


def test_default_is_what_the_served_figures_choose_on_each_measured_machine():
    for machine, rows in _served_by_machine().items():
        best, scores = served_default(rows)
        want = None if best == "none" else best
        assert default_speculation(BUNDLED_MODEL, machine) == want, (
            f"served figures on {machine} choose {best} (scores {scores}); update "
            "the profile: run `agentserve bench speculative-served --report-only`"
        )
        measured_k = scores[best]["k"] if want else None
        assert default_speculation_tokens(BUNDLED_MODEL, machine) == measured_k, (
            f"the default drafts what was measured ({measured_k}); update "
            "the profile's speculation section"
        )
        flagged = {(r["server"], r["settings"], r["method"]) for r in rows if r["default"]}
        assert flagged == {("agentserve", default_settings(machine), best)}, (
            "the rows' default flags disagree with the rule: run `agentserve bench "
            "speculative-served --report-only`"
        )


def test_the_default_dtype_is_the_one_the_deciding_rows_were_measured_in():
    """`up` serves the bundled model in the dtype its kind of CPU's default rows used (the
    spec's bfloat16 unless its profile names another), so the default is what was measured."""
    for machine, rows in _served_by_machine().items():
        deciding = {r["dtype"] for r in rows if r["server"] == "agentserve"
                    and r["settings"] == default_settings(machine)}  # fmt: skip
        assert deciding == {default_dtype(BUNDLED_MODEL, machine) or "bfloat16"}, (
            f"{machine}: the default rows were measured in {deciding}; update "
            "the profile's speculation section"
        )


def test_every_profiled_default_has_served_figures_behind_it():
    measured = set(_served_by_machine())
    profiled = [p for p in sorted(profiles.PROFILE_DIR.glob("*.json"))
                if profiles.load_profile(p).speculation is not None]  # fmt: skip
    assert profiled
    for path in profiled:
        speculation = profiles.load_profile(path).speculation
        assert set(speculation.values) == {BUNDLED_MODEL} and path.stem in measured, (
            f"{path.name} has a default speculation but no served figures were recorded there"
        )
        assert speculation.source.rows == "docs/benchmarks/speculative.json"


def test_an_unmeasured_machine_gets_plain_decoding_and_is_told_why():
    assert default_speculation(BUNDLED_MODEL, "amx-unmeasured") is None
    assert "no served speculation figures" in default_speculation_reason(BUNDLED_MODEL, "x")
    assert default_speculation("some/other-model", "avx2") is None

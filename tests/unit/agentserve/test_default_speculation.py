"""`agentserve up`'s default speculation for the bundled model follows the committed served
figures (`agentserve bench speculative-served`, the "path": "served" rows of
docs/benchmarks/speculative.json), per kind of machine: a new run that changes the winner
fails here until agentserve.drafters.DEFAULT_SPECULATION follows it, and a kind of machine
without served figures gets plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentserve.drafters import (
    DEFAULT_SPECULATION,
    default_speculation,
    default_speculation_reason,
)
from agentserve.model_sources import BUNDLED_MODEL
from agentserve_bench.served_rows import served_default

FIGURES = Path(__file__).resolve().parents[3] / "docs" / "benchmarks" / "speculative.json"


def _served_by_machine() -> dict[str, list[dict]]:
    if not FIGURES.is_file():
        pytest.fail(f"{FIGURES} is missing: run `agentserve bench speculative-served`")
    out: dict[str, list[dict]] = {}
    for r in json.loads(FIGURES.read_text()):
        if r.get("path") == "served":
            out.setdefault(r["machine"]["cpu_class"], []).append(r)
    return out


def test_there_are_served_figures_to_choose_from():
    served = _served_by_machine()
    assert served, "no served rows: run `agentserve bench speculative-served`"
    for rows in served.values():
        assert {r["workload"] for r in rows} == {"coding", "agent"}
        assert {r["concurrency"] for r in rows} >= {1, 4}


def test_default_is_what_the_served_figures_choose_on_each_measured_machine():
    for machine, rows in _served_by_machine().items():
        best, scores = served_default(rows)
        want = None if best == "none" else best
        assert default_speculation(BUNDLED_MODEL, machine) == want, (
            f"served figures on {machine} choose {best} (scores {scores}); update "
            "agentserve.drafters.DEFAULT_SPECULATION"
        )
        assert all(r["default"] == (r["server"] == "agentserve" and r["method"] == best)
                   for r in rows), "the rows' default flags disagree with the rule"  # fmt: skip


def test_every_table_entry_has_served_figures_behind_it():
    measured = set(_served_by_machine())
    for model, machine in DEFAULT_SPECULATION:
        assert model == BUNDLED_MODEL and machine in measured, (
            f"DEFAULT_SPECULATION has {machine!r} but no served figures were recorded there"
        )


def test_an_unmeasured_machine_gets_plain_decoding_and_is_told_why():
    assert default_speculation(BUNDLED_MODEL, "amx-unmeasured") is None
    assert "no served speculation figures" in default_speculation_reason(BUNDLED_MODEL, "x")
    assert default_speculation("some/other-model", "avx2") is None

"""Held-out workloads of different copy rates and their fixed tuning/reporting split."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from agentserve_bench.heldout_workloads import HALVES, half_of, kind_messages, text_half
from agentserve_bench.served_rows import (
    fill_ratios,
    machine_default_settings,
    row,
    served_default,
)


@dataclass(frozen=True)
class _Snippet:
    module: str
    name: str
    source: str
    doc: str | None


def _snippets(n: int) -> list[_Snippet]:
    doc = "Add two numbers and return the sum."
    body = f'    """{doc}"""\n    return a + b\n'
    return [_Snippet("pkg.mod", f"f{i}", f"def f{i}(a, b):\n{body}", doc) for i in range(n)]


def test_half_is_a_fixed_rule_that_splits_both_ways():
    names = [f"pkg.mod.f{i}" for i in range(200)]
    halves = [half_of(n) for n in names]
    assert halves == [half_of(n) for n in names]  # stable
    assert set(halves) == set(HALVES)
    assert 60 < halves.count("tune") < 140  # roughly even
    assert text_half([{"role": "user", "content": "x"}]) == half_of("x")


@pytest.mark.parametrize("kind", ["write", "edit", "explain"])
def test_a_function_never_crosses_halves(kind):
    pool = _snippets(60)
    tune = kind_messages(kind, 5, "tune", snippets=pool)
    report = kind_messages(kind, 5, "report", snippets=pool)

    def names(convs):
        return {s.name for s in pool for c in convs if f"def {s.name}(" in c[0]["content"]}

    assert len(tune) == len(report) == 5
    assert names(tune) and names(report)
    assert not names(tune) & names(report)
    assert all(half_of(f"pkg.mod.{n}") == "tune" for n in names(tune))


def test_write_hides_the_body_edit_and_explain_show_it():
    pool = _snippets(20)
    write = kind_messages("write", 3, None, snippets=pool)
    edit = kind_messages("edit", 3, None, snippets=pool)
    explain = kind_messages("explain", 3, None, snippets=pool)
    assert all("return a + b" not in c[0]["content"] for c in write)
    assert all("Add two numbers" in c[0]["content"] for c in write)
    assert all("return a + b" in c[0]["content"] for c in edit + explain)
    assert all("no code" in c[0]["content"] for c in explain)


def test_too_few_prompts_and_bad_names_are_errors():
    with pytest.raises(ValueError, match="only"):
        kind_messages("edit", 50, "tune", snippets=_snippets(20))
    with pytest.raises(ValueError, match="kind"):
        kind_messages("poem", 1, None, snippets=_snippets(2))
    with pytest.raises(ValueError, match="half"):
        kind_messages("edit", 1, "middle", snippets=_snippets(2))


def _served(method: str, half: str, c: int, tok_s: float) -> dict:
    figures = {"decode_tokens_per_s": tok_s, "throughput_tokens_per_s": tok_s, "ttft_ms_p50": 1.0,
               "output_tokens": 10, "requests": 1}  # fmt: skip
    machine = {"cpu_class": "avx512_bf16"}
    settings = machine_default_settings({"machine": machine})
    return row(server="agentserve", method=method, k=8, workload="edit", concurrency=c,
               figures=figures, counters={}, machine=machine, dtype="bfloat16", engine_env={},
               texts=["x"], half=half, settings=settings)  # fmt: skip


def test_only_the_tuning_half_decides_the_default():
    # ngram wins on the reporting half only: the default must not follow it
    rows = [_served("none", h, c, 50.0) for h in HALVES for c in (1, 4)]
    rows += [_served("ngram", "tune", c, 50.0) for c in (1, 4)]
    rows += [_served("ngram", "report", c, 90.0) for c in (1, 4)]
    assert served_default(fill_ratios(rows, None))[0] == "none"
    won = [{**r, "decode_tokens_per_s": 90.0} if r["method"] == "ngram" else r for r in rows]
    assert served_default(fill_ratios(won, None))[0] == "ngram"

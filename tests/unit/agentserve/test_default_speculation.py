"""`agentserve up`'s default speculation for the bundled model is the method that the committed
`agentserve bench speculative` figures (docs/benchmarks/speculative.json) measured fastest at
batch 1: a new benchmark run that changes the winner fails here until the default follows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from agentserve.drafters import default_speculation
from agentserve.model_sources import BUNDLED_MODEL

FIGURES = Path(__file__).resolve().parents[3] / "docs" / "benchmarks" / "speculative.json"


def fastest_at_batch_1(records: list[dict]) -> tuple[str, dict[str, float]]:
    """The vLLM method with the best geometric-mean speedup over temperatures at batch 1
    (each method at its best k), and every method's figure; "none" is plain decoding."""
    by_method: dict[tuple[str, int], dict[float, float]] = {}
    for r in records:
        if r.get("engine") != "vllm" or r.get("batch_size") != 1 or "test" in r:
            continue
        key = (r["method"], r["num_speculative_tokens"])
        by_method.setdefault(key, {})[r["temperature"]] = r["speedup_vs_no_spec"]
    temperatures = {t for speedups in by_method.values() for t in speedups}
    scores: dict[str, float] = {}
    for (method, _k), speedups in by_method.items():
        if set(speedups) != temperatures:
            continue  # not measured at every temperature: no fair comparison
        score = math.exp(sum(math.log(s) for s in speedups.values()) / len(speedups))
        scores[method] = max(score, scores.get(method, 0.0))
    return max(scores, key=scores.__getitem__), scores


def test_rule_picks_the_fastest_and_counts_every_temperature():
    rec = [
        {"engine": "vllm", "batch_size": 1, "method": m, "num_speculative_tokens": k,
         "temperature": t, "speedup_vs_no_spec": s}
        for m, k, t, s in [
            ("none", 0, 0.0, 1.0), ("none", 0, 1.0, 1.0),
            ("ngram", 7, 0.0, 1.7), ("ngram", 7, 1.0, 0.9),  # geo-mean 1.24
            ("dflash", 7, 0.0, 2.5), ("dflash", 7, 1.0, 0.3),  # geo-mean 0.87
        ]
    ]  # fmt: skip
    assert fastest_at_batch_1(rec)[0] == "ngram"
    rec[-1]["speedup_vs_no_spec"] = 0.8  # dflash geo-mean 1.41
    assert fastest_at_batch_1(rec)[0] == "dflash"
    for r in rec[2:]:
        r["speedup_vs_no_spec"] = 0.5
    assert fastest_at_batch_1(rec)[0] == "none"


def test_default_is_the_measured_fastest_method():
    if not FIGURES.is_file():
        pytest.fail(f"{FIGURES} is missing: run `agentserve bench speculative`")
    best, scores = fastest_at_batch_1(json.loads(FIGURES.read_text()))
    want = None if best == "none" else best.split("+")[0]
    assert default_speculation(BUNDLED_MODEL) == want, (
        f"benchmark says {best} is fastest at batch 1 (geo-mean speedups {scores}); "
        "update agentserve.drafters.DEFAULT_SPECULATION"
    )

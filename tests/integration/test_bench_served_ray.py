"""`agentserve bench speculative-served --engine fake` end to end: a fresh local Ray Serve app
per method (serve/local.py, as `agentserve up` runs it), held-out conversations over HTTP,
counters from the admin /metrics, records and the default rule from the tuning half (~90 s).
The fake engine emits two tokens per step for a method other than none, so the rule must
pick it."""

from __future__ import annotations

import json

import pytest
from agentserve.cli import main

pytest.importorskip("ray.serve")


def test_served_bench_fake_engine_through_ray_serve(tmp_path, capsys):
    argv = ["bench", "speculative-served", "--engine", "fake", "--peer-methods", "",
            "--methods", "ngram:4", "--workloads", "coding", "--concurrency", "1,2",
            "--num-prompts", "2", "--max-tokens", "16", "--metrics-settle-s", "1",
            "--docs", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((tmp_path / "benchmarks" / "speculative.json").read_text())
    # both halves of the workload by default; only the tuning half decides the default
    assert sorted((r["method"], r["concurrency"], r["half"]) for r in rows) == sorted(
        (m, c, h) for m in ("none", "ngram") for c in (1, 2) for h in ("tune", "report")
    )
    for r in rows:
        assert r["path"] == "served" and r["server"] == "agentserve" and r["requests"] == 2
        assert r["output_tokens"] == 32 and r["decode_tokens_per_s"] > 0
        assert len(r["text_digests"]) == 2 and r["machine"]["cores"] >= 1
    ngram = [r for r in rows if r["method"] == "ngram"]
    # two tokens a step, read from the platform's own counters and timed at the caller
    assert all(r["tau"] > 1.5 and r["speedup_vs_plain"] > 1.3 for r in ngram)
    assert all(r["greedy_identical"] == "2/2" for r in rows)
    assert [r["default"] for r in rows] == [
        r["method"] == "ngram" and r["half"] == "tune" for r in rows
    ]
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "Speculation through the server" in doc and ": ngram.**" in doc
    assert "default by the served rule: ngram" in capsys.readouterr().out

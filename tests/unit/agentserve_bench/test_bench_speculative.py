"""`agentserve bench speculative`: method configs are the ones `agentserve up` would use."""

from __future__ import annotations

import pytest
from agentserve_bench import command
from agentserve_bench.command import _methods
from agentserve_bench.speculative import method_speculative_config


def test_methods_build_the_served_speculative_config(drafter_dir):
    assert method_speculative_config("none", 0, "/models/m", None) is None
    dflash = method_speculative_config("dflash", 7, "/models/m", str(drafter_dir))
    assert dflash == {"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": 7}
    ngram = method_speculative_config("ngram", 5, "/models/m", None)
    assert ngram["method"] == "ngram" and ngram["prompt_lookup_min"] >= 1
    scheduled = method_speculative_config("dflash+schedule", 7, "/models/m", str(drafter_dir))
    schedule = scheduled["num_speculative_tokens_per_batch_size"]
    assert schedule[0][0] == 1 and all(0 <= k <= 7 for _, _, k in schedule)
    with pytest.raises(ValueError, match="exceeds"):
        method_speculative_config("dflash", 16, "/models/m", str(drafter_dir))


def test_method_list_parsing(monkeypatch):
    monkeypatch.setattr(command, "find_spec", lambda name: None)
    assert _methods("none,dflash:5,dflash+schedule,suffix:7,ngram") == [
        ("none", 0),
        ("dflash", 5),
        ("dflash+schedule", 7),
        ("ngram", 7),
    ]


def test_the_driver_runs_each_method_then_the_identity_pass_and_writes_the_docs(
    tmp_path, drafter_dir, monkeypatch, capsys
):
    """`agentserve bench speculative` end to end with vLLM's runs faked: the grid it asks
    for, the float32 identity pass (none vs the first dflash k), the figures it writes."""
    import json

    import transformers
    from agentserve.cli import main

    calls = []

    def fake_runs(model, drafter, prompts, max_tokens, batches, temperatures, methods, **kw):
        calls.append((model, drafter, len(prompts), max_tokens, batches, temperatures, methods, kw))
        return [
            {
                "engine": "vllm",
                "dtype": kw.get("dtype", "bfloat16"),
                "method": method,
                "num_speculative_tokens": k,
                "temperature": t,
                "batch_size": b,
                "tokens": 12,
                "seconds": 1.0 if k == 0 else 0.5,
                "tokens_per_s": 12.0 if k == 0 else 24.0,
                "tau": 1.0 if k == 0 else 2.0,
                "tau_histogram": {} if k == 0 else {"1": 1, "3": 1},
                "per_position_acceptance": [] if k == 0 else [0.5, 0.25],
                "outputs": [[1, 2, 3]] * len(prompts),
            }
            for method, k in methods
            for t in temperatures
            for b in batches
        ]

    monkeypatch.setattr(command, "resolve_model", lambda source: tmp_path / "model")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: object())
    monkeypatch.setattr(command, "_heldout_ids", lambda tokenizer, n: [[1, 2]] * n)
    monkeypatch.setattr(command, "vllm_runs", fake_runs)
    argv = ["bench", "speculative", "--drafter", str(drafter_dir), "--num-prompts", "3"]
    argv += ["--methods", "none,dflash:5", "--batch-sizes", "1,2", "--temperatures", "0"]
    assert main([*argv, "--docs", str(tmp_path / "docs")]) == 0

    grid, identity = calls
    assert grid[2:7] == (3, 128, [1, 2], [0.0], [("none", 0), ("dflash", 5)])
    assert grid[:2] == (str(tmp_path / "model"), str(drafter_dir))
    assert identity[5:] == (
        [0.0],
        [("none", 0), ("dflash", 5)],
        {"engine_overrides": {"enforce_eager": True}, "dtype": "float32"},
    )
    records = json.loads((tmp_path / "docs" / "benchmarks" / "speculative.json").read_text())
    assert sorted(r["dtype"] for r in records) == ["bfloat16"] * 4 + ["float32"] * 4
    assert all("outputs" not in r for r in records)
    assert {r["speedup_vs_no_spec"] for r in records if r["method"] == "dflash"} == {2.0}
    assert all(r["outputs_identical"] for r in records)
    assert "| vllm" in (tmp_path / "docs" / "benchmarks.md").read_text()
    assert (tmp_path / "docs" / "img" / "speculative.png").stat().st_size > 0


def test_the_sampling_check_drafts_hybrid_with_dflash_in_every_batch(drafter_dir):
    from agentserve_bench.sampling import method_configs
    from agentserve_bench.speculative import HYBRID_CONFIG_KEY

    drafter = str(drafter_dir)
    shipped = method_speculative_config("hybrid", 3, "/models/m", drafter)
    assert shipped[HYBRID_CONFIG_KEY]["dflash_max_batch"] == 1  # as `agentserve up` runs it
    configs = method_configs(["ngram", "hybrid"], "/models/m", drafter, 3)
    assert configs["hybrid"][HYBRID_CONFIG_KEY]["dflash_max_batch"] is None
    assert configs["ngram"] == method_speculative_config("ngram", 3, "/models/m", None)

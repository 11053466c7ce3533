"""`agentserve bench core-slots`: its variants, paired summary and section (the run itself
starts real engines: docs/benchmarks.md "core-slots")."""

from __future__ import annotations

import argparse

import pytest
from agentserve.spec import DeploymentSpec
from agentserve_bench import core_slots


def test_each_variant_serves_its_replicas_with_its_binding():
    base = DeploymentSpec()
    one, one_env = core_slots.variant_spec(base, "one", 2)
    shared, shared_env = core_slots.variant_spec(base, "shared", 2)
    slots, slots_env = core_slots.variant_spec(base, "slots", 2)
    assert [s.models[0].replicas.min_replicas for s in (one, shared, slots)] == [1, 2, 2]
    assert [s.models[0].replicas.max_replicas for s in (one, shared, slots)] == [1, 2, 2]
    assert (one_env, shared_env, slots_env) == ("1", "1", "2")
    assert slots.models[0].source == base.models[0].source


def _row(round_: int, variant: str, c: int, tput: float, ttft: float) -> dict:
    return {"kind": "level", "round": round_, "variant": variant, "concurrency": c,
            "throughput_tokens_per_s": tput, "decode_tokens_per_s": tput / c,
            "ttft_ms_p50": ttft}  # fmt: skip


def test_summary_pairs_slots_with_each_other_variant_within_rounds():
    rows = [
        _row(0, "one", 4, 100.0, 200.0), _row(0, "shared", 4, 50.0, 400.0),
        _row(0, "slots", 4, 120.0, 150.0), _row(1, "slots", 4, 90.0, 300.0),
        _row(1, "one", 4, 100.0, 200.0), _row(1, "shared", 4, 60.0, 500.0),
    ]  # fmt: skip
    by = {s["against"]: s for s in core_slots.summarize(rows)}
    assert by["one"]["throughput_tokens_per_s"] == [100.0, 105.0]
    assert by["one"]["throughput_tokens_per_s_ratio"] == 1.05  # median of 1.2 and 0.9
    assert by["one"]["throughput_tokens_per_s_higher_in_rounds"] == 1
    assert by["shared"]["throughput_tokens_per_s_ratio"] == 1.95  # median of 2.4 and 1.5
    assert by["shared"]["ttft_ms_p50_ratio"] == pytest.approx(0.4875, abs=1e-3)  # 0.375, 0.6
    machine = {"cpu_class": "avx2"}
    records = [{**s, "machine": machine, "replicas": 2, "command": "x", "date": "d"}
               for s in by.values()]  # fmt: skip
    text = core_slots.section(records)
    assert "| avx2 | 2 | 4 | 2 | shared | 55.0 / 105.0 | 1.95x | 2 of 2 |" in text


def test_vllms_server_serves_one_engine_and_slots_always_run():
    spec, engines = core_slots.variant_spec(DeploymentSpec(), "vllm", 4)
    assert (spec.models[0].replicas.max_replicas, engines) == (1, "1")
    assert core_slots._variants("one,vllm") == ("slots", "one", "vllm")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown variant"):
        core_slots._variants("slots,two")

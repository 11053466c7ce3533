"""agentserve_bench/plain_peer.py: alternating rounds, ratios agentserve / vLLM paired within a
round, the docs section, and the command's wiring (servers stood in for by `_measure`)."""

import json
import subprocess
import sys

import pytest
from agentserve_bench import plain_peer, speculative_served
from agentserve_bench.plain_peer import ARMS, round_order, section, summarize


def _level(round_: int, server: str, c: int, decode: float, ttft: float = 100.0) -> dict:
    return {"kind": "level", "round": round_, "server": server, "concurrency": c,
            "decode_tokens_per_s": decode, "throughput_tokens_per_s": decode * c,
            "ttft_ms_p50": ttft}  # fmt: skip


def test_rounds_alternate_which_server_runs_first():
    assert [round_order(i) for i in range(3)] == [ARMS, ARMS[::-1], ARMS]
    assert set(ARMS) == {"vllm_serve", "agentserve"}


def test_summary_is_agentserve_over_vllm_paired_within_each_round():
    rows = [
        _level(0, "vllm_serve", 4, 50.0, 100.0),
        _level(0, "agentserve", 4, 40.0, 150.0),
        _level(1, "agentserve", 4, 45.0, 120.0),
        _level(1, "vllm_serve", 4, 45.0, 100.0),
        _level(2, "vllm_serve", 4, 30.0, 100.0),  # agentserve never ran in round 2: unpaired
    ]
    (s,) = summarize(rows)
    assert s["concurrency"] == 4 and s["rounds"] == 2
    assert s["decode_tokens_per_s"] == [47.5, 42.5]  # medians: vLLM, agentserve
    assert s["decode_tokens_per_s_ratio_median"] == 0.9  # (0.8 + 1.0) / 2
    assert s["decode_tokens_per_s_higher_in_rounds"] == 0
    assert s["ttft_ms_p50_ratio_median"] == 1.35


def test_section_has_one_line_per_cpu_and_concurrency():
    common = {"machine": {"cpu_class": "avx512_bf16"}, "date": "2026-11-28", "command": "c"}
    rows = [{**_level(0, "vllm_serve", 1, 50.0), **common},
            {**_level(0, "agentserve", 1, 45.0), **common}]  # fmt: skip
    text = section(rows + [{**s, **common} for s in summarize(rows)])
    assert "Measured 2026-11-28 with `c`" in text
    assert "| avx512_bf16 | 1 | 1 | 50.0 / 45.0 | 0.9x (0 of 1) | 50.0 / 45.0 | 0.9x |" in text


def test_run_measures_both_servers_each_round_and_writes_the_rows(tmp_path, monkeypatch):
    calls = []

    def measure(server, method, k, spec, args, conversations, machine, settings, logs):
        calls.append(server)
        # _measure's contract: conversations keyed (workload, half), greedy requests
        assert [key for key in conversations] == [("coding", "both")]
        assert args.temperatures == [0.0]
        rate = 50.0 if server == "vllm_serve" else 44.0
        return [{"concurrency": c, "decode_tokens_per_s": rate, "throughput_tokens_per_s": rate,
                 "ttft_ms_p50": 90.0} for c in args.concurrency]  # fmt: skip

    monkeypatch.setattr(speculative_served, "_measure", measure)
    (tmp_path / "benchmarks").mkdir()
    args = plain_peer_args(tmp_path, rounds=3)
    assert plain_peer.run(args) == 0
    assert calls == ["vllm_serve", "agentserve", "agentserve", "vllm_serve",
                     "vllm_serve", "agentserve"]  # fmt: skip
    rows = json.loads((tmp_path / "benchmarks" / "plain-peer.json").read_text())
    summaries = [r for r in rows if r["kind"] == "summary"]
    assert [s["concurrency"] for s in summaries] == [1, 4]
    assert all(s["rounds"] == 3 and s["decode_tokens_per_s_ratio_median"] == 0.88
               for s in summaries)  # fmt: skip
    assert "<!-- plain-peer:begin -->" in (tmp_path / "benchmarks.md").read_text()


def plain_peer_args(docs, rounds: int):
    import argparse

    return argparse.Namespace(rounds=rounds, num_prompts=2, max_tokens=8, concurrency=[1, 4],
                              start_timeout_s=10.0, logs=str(docs / "logs"), docs=docs)  # fmt: skip


@pytest.mark.parametrize("flag", ["--rounds", "--concurrency", "--docs"])
def test_the_command_is_registered_with_its_options(flag):
    out = subprocess.run([sys.executable, "-m", "agentserve.cli", "bench", "plain-peer", "--help"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert flag in out.stdout and "paired" in out.stdout

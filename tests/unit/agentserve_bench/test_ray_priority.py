"""agentserve_bench/ray_priority.py: finding Serve's niced threads, and the paired summary."""

import os
import subprocess
import time

from agentserve_bench.ray_priority import ray_threads, section, summarize


def test_finds_the_threads_of_serve_processes_at_a_niceness():
    named = subprocess.Popen(["bash", "-c", 'exec -a "ray::ServeReplica:app:model" sleep 30'])
    other = subprocess.Popen(["sleep", "30"])  # not Serve's: left alone
    try:
        time.sleep(0.3)
        level = os.getpriority(os.PRIO_PROCESS, named.pid)  # whatever the tests run at
        found = ray_threads(level)
        assert named.pid in found
        assert other.pid not in found
        assert named.pid not in ray_threads(level - 1)
    finally:
        named.kill()
        other.kill()


def _row(i: int, niceness: int, c: int, decode: float, ttft: float) -> dict:
    return {"kind": "level", "round": i, "niceness": niceness, "concurrency": c,
            "decode_tokens_per_s": decode, "ttft_ms_p50": ttft}  # fmt: skip


def test_summary_pairs_rounds_and_takes_medians():
    rows = [
        _row(0, 15, 1, 20.0, 200.0), _row(0, 0, 1, 22.0, 100.0),
        _row(1, 0, 1, 30.0, 150.0), _row(1, 15, 1, 30.0, 120.0),  # a faster minute
        _row(2, 15, 1, 25.0, 250.0), _row(2, 0, 1, 25.0, 125.0),
        _row(3, 15, 1, 25.0, 250.0),  # unpaired: left out
    ]  # fmt: skip
    [s] = summarize(rows)
    assert s["rounds"] == 3
    assert s["decode_ratio_median"] == 1.0  # 1.1, 1.0, 1.0
    assert s["ttft_ratio_median"] == 0.5  # 0.5, 1.25, 0.5
    assert s["ttft_lower_in_rounds"] == 2
    assert s["nice15_ttft_ms_p50"] == 200.0 and s["nice0_ttft_ms_p50"] == 125.0
    text = section([{**s, "machine": {"cpu_class": "amx"}, "command": "agentserve bench x"}])
    assert "| amx | 1 | 3 | 25.0 / 25.0 | 1.0x | 200.0 / 125.0 | 0.5x | 2 of 3 |" in text

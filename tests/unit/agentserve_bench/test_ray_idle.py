"""agentserve_bench/ray_idle.py: the paired summary, its section, the CPU reading, and the
neighbour arms being exactly Ray's values for what agentserve turns off."""

import os
import subprocess
import sys

from agentserve.ray_env import UNREAD
from agentserve_bench.ray_idle import ARMS, NEIGHBOURS, cpu_seconds, section, summarize


def _level(round_: int, arm: str, rate: float) -> dict:
    return {"kind": "level", "round": round_, "arm": arm, "concurrency": 1,
            "decode_tokens_per_s": rate}  # fmt: skip


def test_summary_pairs_each_neighbour_with_alone_and_lean_with_unread_on():
    rows = [
        _level(0, "alone", 50.0),
        _level(0, "lean", 47.5),
        _level(0, "unread-on", 45.0),
        _level(1, "alone", 40.0),
        _level(1, "lean", 40.0),
        _level(1, "unread-on", 32.0),
    ]
    by_arms = {s["arms"]: s for s in summarize(rows)}
    assert set(by_arms) == {"lean / alone", "unread-on / alone", "lean / unread-on"}
    lean = by_arms["lean / alone"]
    assert lean["rounds"] == 2
    assert lean["ratio_median"] == round((0.95 + 1.0) / 2, 3)
    assert lean["higher_in_rounds"] == 0
    assert by_arms["unread-on / alone"]["ratio_median"] == round((0.9 + 0.8) / 2, 3)
    better = by_arms["lean / unread-on"]
    assert better["higher_in_rounds"] == 2 and better["ratio_median"] > 1


def test_section_lists_ratios_and_the_idle_cpu_averaged_over_rounds():
    machine = {"machine": {"cpu_class": "avx512_bf16"}, "date": "2026-11-28", "command": "x"}
    rows = [
        {**_level(0, "alone", 50.0), **machine},
        {**_level(0, "lean", 45.0), **machine},
        {**_level(0, "unread-on", 40.0), **machine},
    ]
    for round_, raylet in ((0, 0.2), (1, 0.4)):
        rows.append({"kind": "idle_cpu", "round": round_, "arm": "lean",
                     "per_30s": {"raylet": raylet, "x": 0.1}, **machine})  # fmt: skip
    text = section(rows + [{**s, **machine} for s in summarize(rows)])
    assert "| avx512_bf16 | lean / alone | 1 | 45.0 / 50.0 | 0.9x | 0 of 1 |" in text
    assert "avx512_bf16 lean: 0.4 CPU-s per 30 s (raylet 0.3, x 0.1)" in text


def test_unread_on_restores_rays_own_defaults_for_every_unread_loop():
    assert ARMS[0] == "alone" and NEIGHBOURS["lean"] == {}
    on = NEIGHBOURS["unread-on"]
    assert set(UNREAD) < set(on) and on["AGENTSERVE_RAY_LOG_MONITOR"] == "keep"
    assert all(on[key] != value for key, value in UNREAD.items())


def test_cpu_seconds_counts_a_busy_child():
    busy = "import time\nt=time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    child = subprocess.Popen([sys.executable, "-c", busy + "time.sleep(30)"])
    try:
        import time

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            seconds = cpu_seconds(os.getpid())
            if seconds.get("python", 0) + seconds.get("python3", 0) >= 0.3:
                break
            time.sleep(0.2)
        assert sum(seconds.values()) >= 0.3
    finally:
        child.kill()
        child.wait()

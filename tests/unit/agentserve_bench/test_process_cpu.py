"""agentserve_bench/process_cpu.py: process roles, CPU seconds by role between snapshots, the
docs line, and a real snapshot of this machine's /proc."""

from __future__ import annotations

import os
import sys
import time

import pytest
from agentserve_bench.process_cpu import ROLES, cpu_by_role, cpu_line, role_of, snapshot


@pytest.mark.parametrize(
    ("command", "role"),
    [
        ("VLLM::EngineCore", "engine"),
        ("/venv/bin/python -B -c from multiprocessing.spawn import spawn_main", "engine"),
        ("ray::ServeReplica:agentserve:ingress", "ingress"),
        ("ray::ServeReplica:agentserve:model-smollm2-135m-instruct", "replica"),
        ("ray::ProxyActor", "proxy"),
        ("/venv/bin/python -m vllm.entrypoints.openai.api_server --model m", "api_server"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "ray_other"),
        ("ray::ServeController", "ray_other"),
        ("/usr/sbin/sshd -D", "other"),
    ],
)
def test_roles_from_command_lines(command, role):
    assert role_of(command, pid=10, own_pid=1) == role


def test_the_benchmark_process_is_its_own_role():
    assert role_of("VLLM::EngineCore", pid=7, own_pid=7) == "bench"


def test_cpu_by_role_sums_differences_new_processes_from_zero():
    before = {1: ("engine", 10.0), 2: ("ingress", 1.0), 3: ("other", 5.0)}
    after = {1: ("engine", 14.5), 2: ("ingress", 1.25), 4: ("proxy", 0.5)}  # 3 ended, 4 new
    spent = cpu_by_role(before, after)
    assert set(spent) == set(ROLES)
    assert (spent["engine"], spent["ingress"], spent["proxy"], spent["other"]) == (
        4.5,
        0.25,
        0.5,
        0.0,
    )
    assert cpu_by_role({}, after) == {}  # no /proc: nothing recorded


def _row(server, c, engine, ingress, tokens=2000):
    return {"server": server, "method": "ngram", "workload": "write", "half": "report",
            "concurrency": c, "output_tokens": tokens, "machine": {"cpu_class": "avx2"},
            "cpu_s_by_role": {"engine": engine, "ingress": ingress, "other": 0.2}}  # fmt: skip


def test_the_line_shows_the_highest_concurrency_per_thousand_tokens():
    rows = [_row("agentserve", 16, 12.0, 1.0), _row("agentserve", 4, 9.0, 0.5)]
    rows.append({**_row("vllm_serve", 16, 11.0, 0.0), "cpu_s_by_role": {"engine": 11.0}})
    line = cpu_line([*rows, {"server": "x", "concurrency": 64}])  # a row without figures
    assert "c=4" not in line
    assert "avx2 agentserve/ngram write/report c=16: engine 6.00, serving 0.50 (ingress 0.50)" in (
        line
    )
    assert "vllm_serve/ngram write/report c=16: engine 5.50, serving 0.00, other 0.00" in line
    assert cpu_line([{"server": "x", "concurrency": 1}]) == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_real_snapshot_sees_this_process_spend_cpu():
    before = snapshot()
    start = time.process_time()
    while time.process_time() - start < 0.1:  # 0.1 CPU-s here: ten clock ticks
        sum(i * i for i in range(1000))
    after = snapshot()
    assert before[os.getpid()][0] == "bench"
    assert cpu_by_role(before, after)["bench"] > 0

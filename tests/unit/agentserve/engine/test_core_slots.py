"""Core slots for several CPU replicas on one machine (engine/core_slots.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
from agentserve.engine import core_slots, cpu_settings
from agentserve.engine.core_slots import claim_cores, split_cores
from agentserve.serve.local import cpu_engine_replicas
from agentserve.spec import spec_from_dict


@pytest.mark.parametrize(
    ("cores", "replicas", "slots"),
    [
        ([0, 1], 2, [[0], [1]]),
        ([0, 1], 4, [[0], [1]]),  # more replicas than cores: one core each, shared
        ([3, 1, 2, 0], 2, [[0, 1], [2, 3]]),
        (list(range(7)), 3, [[0, 1, 2], [3, 4], [5, 6]]),
        ([0, 1, 2], 1, [[0, 1, 2]]),
    ],
)
def test_split_cores_into_contiguous_slots(cores, replicas, slots):
    assert split_cores(cores, replicas) == slots


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def engines():
    """Live processes standing in for engines (their pids claim), killed afterwards."""
    started: list[subprocess.Popen] = []

    def start(n: int) -> list[subprocess.Popen]:
        command = [sys.executable, "-c", "import time; time.sleep(60)"]
        started.extend(subprocess.Popen(command) for _ in range(n))
        return started[-n:]

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_engines_claim_disjoint_slots_then_share_the_least_held(tmp_path, engines):
    path = tmp_path / "slots.json"
    one, two = engines(2)
    first = claim_cores([0, 1, 2, 3], 2, path, pid=one.pid)
    second = claim_cores([0, 1, 2, 3], 2, path, pid=two.pid)
    assert (first, second) == ([0, 1], [2, 3])
    assert claim_cores([0, 1, 2, 3], 2, path, pid=two.pid) == [2, 3]  # again: its own
    recorded = json.loads(path.read_text())
    assert recorded == {
        str(one.pid): {"group": "", "cores": [0, 1]},
        str(two.pid): {"group": "", "cores": [2, 3]},
    }
    (third,) = engines(1)  # autoscaled up: both slots held once, it shares the first
    assert claim_cores([0, 1, 2, 3], 2, path, pid=third.pid) == [0, 1]
    one.kill()
    one.wait()
    # the first engine died: the first slot is held once now, the second still once
    assert claim_cores([0, 1, 2, 3], 2, path, pid=_dead_pid() + 10**6) == [0, 1]
    assert str(one.pid) not in json.loads(path.read_text())


def test_a_dead_engines_claim_frees_its_slot(tmp_path):
    path = tmp_path / "slots.json"
    path.write_text(json.dumps({str(_dead_pid()): {"group": "m", "cores": [0]}}))
    assert claim_cores([0, 1], 2, path, group="m") == [0]
    assert json.loads(path.read_text()) == {str(os.getpid()): {"group": "m", "cores": [0]}}


def test_one_replica_binds_every_core_and_writes_nothing(tmp_path):
    path = tmp_path / "slots.json"
    assert claim_cores([1, 0, 2], 1, path) == [0, 1, 2]
    assert claim_cores([0], 4, path) == [0]
    assert not path.exists()


def test_a_models_replicas_spread_over_the_cores_before_sharing_one(tmp_path, engines):
    """Two models of two replicas on two cores, started interleaved (as Serve does): each
    model gets both cores, so the one under load is not left on one of them."""
    path = tmp_path / "slots.json"
    order = ["a", "b", "a", "b"]
    got = [
        claim_cores([0, 1], 4, path, pid=proc.pid, group=model)
        for proc, model in zip(engines(4), order, strict=True)
    ]
    assert sorted(map(tuple, got[0::2])) == [(0,), (1,)]  # model a
    assert sorted(map(tuple, got[1::2])) == [(0,), (1,)]  # model b


def test_an_unreadable_registry_counts_as_empty(tmp_path):
    path = tmp_path / "slots.json"
    path.write_text("not json")
    assert claim_cores([0, 1], 2, path) == [0]


def _claim(args):
    path, cores, replicas = args
    return claim_cores(cores, replicas, path)


def test_concurrent_claims_from_processes_get_distinct_slots(tmp_path):
    path = tmp_path / "slots.json"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:  # four engines at once, four slots, all alive while claiming
        got = pool.map(_claim, [(path, [0, 1, 2, 3], 4)] * 4, chunksize=1)
    # a pool worker may serve two tasks (it keeps its own slot then); never two workers one
    held = [tuple(claim["cores"]) for claim in json.loads(path.read_text()).values()]
    assert sorted(held) == sorted(set(held))
    assert all(len(cores) == 1 for cores in got)


def test_replica_cores_follow_the_node_count_unless_binding_is_set(tmp_path, monkeypatch):
    monkeypatch.setenv(core_slots.REGISTRY_VARIABLE, str(tmp_path / "slots.json"))
    monkeypatch.setattr(cpu_settings, "_usable_cores", lambda: [0, 1])
    assert cpu_settings._replica_cores("m", {}) is None
    assert cpu_settings._replica_cores("m", {core_slots.REPLICAS_VARIABLE: "1"}) is None
    assert cpu_settings._replica_cores("m", {core_slots.REPLICAS_VARIABLE: "2"}) == [0]
    bound = {core_slots.REPLICAS_VARIABLE: "2", "VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert cpu_settings._replica_cores("m", bound) is None
    auto = {core_slots.REPLICAS_VARIABLE: "2", "AGENTSERVE_CPU_BIND": "auto"}
    assert cpu_settings._replica_cores("m", auto) is None
    env = cpu_settings.engine_environment({}, cores=[1], iomp=False, malloc=False)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_the_local_node_counts_its_cpu_engines():
    spec = spec_from_dict(
        {
            "models": [
                {"name": "a", "replicas": {"min_replicas": 2, "max_replicas": 3}},
                {"name": "b", "engine": "fake", "replicas": {"min_replicas": 2, "max_replicas": 2}},
                {"name": "c", "replicas": {"initial_replicas": 1, "max_replicas": 2}},
            ]
        }
    )
    assert cpu_engine_replicas(spec) == 3  # the fake engine binds nothing


def test_a_process_spawned_while_confined_keeps_the_slot_and_the_thread_gets_its_own_back():
    mine = os.sched_getaffinity(0)
    core = min(mine)
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    with core_slots.confined([core]):
        inside = subprocess.run(probe, capture_output=True, text=True, check=True).stdout
    assert inside.strip() == str([core])
    assert os.sched_getaffinity(0) == mine
    with core_slots.confined(None):
        assert os.sched_getaffinity(0) == mine

"""The simulator's replica start: measured (docs/benchmarks/startup.json) for the engine it
simulates, reported by its replicas to the policy as the live replicas report theirs."""
# ruff: noqa: E501  (one table row per line reads best)

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from agentserve.autoscale.policy_types import DEFAULT_REPLICA_START_S
from agentserve_bench.autoscale.compare import (
    PolicyController,
    Scenario,
    policy_spec_for,
    replica_start_for,
)
from agentserve_bench.autoscale.measured_start import (
    engine_start_s,
    scale_up_start_s,
    startup_path,
)
from agentserve_bench.autoscale.simulate import SimConfig, _Sim, simulate
from agentserve_bench.autoscale.trace import Trace, TraceConfig, generate_trace

AMX, ARM = {"cpu_class": "amx"}, {"cpu_class": "arm"}


def row(kind, ready_s, compile="compiled", machine=AMX, engine="vllm"):
    return {
        "kind": kind,
        "compile": compile,
        "ready_s": ready_s,
        "machine": machine,
        "engine": engine,
    }


CHOICE_COMPILED = {"kind": "choice", "compile": True, "machine": AMX, "engine": "vllm"}
SERVED = {"kind": "served", "compile": "compiled", "engine": "vllm"}
# (name, rows) -> seconds of a vLLM scale-up
# fmt: off
CASES = [
    ("restart stands for a scale-up", [row("first_start", 110.7), row("restart", 42.4)], 42.4),
    ("a measured scale-up wins", [row("restart", 42.4), row("scale_up", 38.0)], 38.0),
    ("first start without a restart", [row("first_start", 110.7)], 110.7),
    ("the largest of a kind", [row("restart", 42.4), row("restart", 47.0, machine=ARM)], 47.0),
    ("the chosen compile mode only", [row("restart", 42.4), row("restart", 50.0, "eager"), CHOICE_COMPILED], 42.4),
    ("every mode without a choice", [row("restart", 42.4), row("restart", 50.0, "eager")], 50.0),
    ("other engines' rows do not count", [row("restart", 42.4, engine="other")], None),
    ("served rows have no start", [SERVED], None),
    ("each kind its closest start, the largest kind", [row("restart", 49.0), row("scale_up", 28.9, machine=ARM), row("restart", 28.8, machine=ARM)], 49.0),
    ("a slow scale-up beside a fast restart", [row("restart", 49.0), row("scale_up", 61.0, machine=ARM)], 61.0),
]
# fmt: on


@pytest.mark.parametrize(("name", "rows", "want"), CASES, ids=[c[0] for c in CASES])
def test_scale_up_start_from_startup_rows(name, rows, want):
    assert scale_up_start_s(rows, "vllm") == want


def test_the_simulator_reads_the_committed_startup_figures(tmp_path):
    rows = json.loads(startup_path().read_text())
    measured = scale_up_start_s(rows, "vllm")
    assert measured is not None and measured != DEFAULT_REPLICA_START_S
    assert engine_start_s("vllm") == measured
    empty = Trace(TraceConfig(), ())
    assert _Sim(empty, lambda _s: 1, SimConfig()).start_s == measured
    assert _Sim(empty, lambda _s: 1, SimConfig(replica_start_s=7.0)).start_s == 7.0  # override
    assert replica_start_for(Scenario()) == measured
    assert policy_spec_for(Scenario()).burst.lead_s == measured
    assert replica_start_for(Scenario(replica_start_s=30.0)) == 30.0
    # nothing measured: the policy's own fallback
    assert engine_start_s("vllm", tmp_path / "missing.json") == DEFAULT_REPLICA_START_S
    assert engine_start_s("no-such-engine") == DEFAULT_REPLICA_START_S


def test_simulated_replicas_report_their_start_to_the_policy():
    """From zero: nothing reported until the first replica is ready, 10 s after the
    decision; then its start, kept (and the fleet serves every call)."""
    small = replace(TraceConfig(), duration_s=60.0, burst_start_s=30.0, burst_s=10.0)
    trace = generate_trace(replace(small, classes=small.classes[:1]))
    seen: list[tuple[float, int, float | None]] = []

    def one_replica(snap):
        seen.append((snap.now_s, snap.ready_replicas, snap.replica_start_s))
        return 1

    cfg = SimConfig(initial_replicas=0, replica_start_s=10.0, interval_s=5.0)
    result = simulate(trace, one_replica, cfg)
    assert all(q.finish_s is not None for q in result.requests)
    assert seen[:3] == [(0.0, 0, None), (5.0, 0, None), (10.0, 1, 10.0)]
    assert {start for _, _, start in seen[2:]} == {10.0}


def test_the_policy_in_the_simulator_sees_the_start_from_the_first_tick():
    """Replicas ready at t = 0 started before the trace, in the measured time."""
    seen: list[float | None] = []
    controller = PolicyController(replace(policy_spec_for(Scenario()), max_replicas=2))

    def spy(snap):
        seen.append(snap.replica_start_s)
        return controller(snap)

    small = replace(TraceConfig(), duration_s=30.0, burst_start_s=10.0, burst_s=5.0)
    simulate(generate_trace(small), spy, SimConfig(initial_replicas=1, replica_start_s=12.5))
    assert seen and set(seen) == {12.5}

"""Simulator and comparison: determinism, conservation, and the baselines' mechanics."""

from __future__ import annotations

from dataclasses import replace

from agentserve.autoscale.policy import Snapshot
from agentserve_bench.autoscale.compare import (
    PolicyController,
    RayDefaultController,
    Scenario,
    policy_spec_for,
    run_comparison,
)
from agentserve_bench.autoscale.simulate import SimConfig, simulate
from agentserve_bench.autoscale.trace import Trace, TraceConfig, generate_trace

SMALL = replace(TraceConfig(), duration_s=180.0, burst_start_s=100.0, burst_s=20.0)
SMALL = replace(
    SMALL, classes=tuple(replace(c, sessions_per_min=c.sessions_per_min / 4) for c in SMALL.classes)
)


def test_trace_is_seeded_and_roundtrips(tmp_path):
    a, b = generate_trace(SMALL), generate_trace(SMALL)
    assert a == b and a != generate_trace(replace(SMALL, seed=8))
    assert {s.tenant for s in a.sessions} == {"interactive", "batch"}
    assert all(c.new_tokens <= c.prompt_tokens for s in a.sessions for c in s.calls)
    a.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json") == a


def test_fixed_fleet_serves_every_call_deterministically():
    trace = generate_trace(SMALL)
    cfg = SimConfig(initial_replicas=2)
    first = simulate(trace, lambda _s: 2, cfg)
    second = simulate(trace, lambda _s: 2, cfg)
    assert len(first.requests) == trace.num_calls
    assert all(q.finish_s is not None and q.first_token_s is not None for q in first.requests)
    assert [q.finish_s for q in first.requests] == [q.finish_s for q in second.requests]
    assert first.replica_seconds == 2 * first.end_s and first.scaling_actions == 0


def test_policy_drives_the_simulated_fleet():
    trace = generate_trace(SMALL)
    cfg = SimConfig(initial_replicas=1, replica_start_s=10.0)
    spec = replace(policy_spec_for(Scenario()), max_replicas=4)
    result = simulate(trace, PolicyController(spec), cfg)
    assert result.scaling_actions >= 1
    assert 1 <= max(p["replicas"] for p in result.timeline) <= 4


def _snap(now, in_flight, ready=2):
    return Snapshot(now_s=now, ready_replicas=ready, in_flight=in_flight)


def test_ray_default_mirrors_target_ongoing_with_delays():
    ray = RayDefaultController(2.0, 1, 10, upscale_delay_s=30, downscale_delay_s=60)
    assert ray(_snap(0, 12)) == 2  # wants 6, holds for the upscale delay
    assert ray(_snap(20, 12)) == 2
    assert ray(_snap(30, 12)) == 6
    assert ray(_snap(40, 0)) == 6  # the look-back mean still says 12 -> 6... then falls
    for t in range(45, 160, 5):
        target = ray(_snap(t, 0, ready=6))
    assert target == 1
    assert RayDefaultController(2.0, 0, 4)(_snap(0, 3, ready=0)) == 2  # from zero at once


def test_comparison_report_shape():
    sc = replace(Scenario(trace=SMALL), max_replicas=4)
    report = run_comparison(sc)
    assert report["ray_default_best"] in report["policies"]
    ours = report["policies"]["sla_policy"]
    assert set(ours["tenants"]) == {"interactive", "batch"}
    assert ours["replica_seconds"] > 0 and 0 <= ours["min_attainment"] <= 1
    assert report["speculation_schedule"][0][0] == 1


def test_policy_controller_runs_any_policy_and_carries_its_state():
    from agentserve.autoscale.policy import PolicyState, ScaleDecision

    seen = []

    def count_calls(snap, spec, state):
        seen.append(state.last_up_s)
        return ScaleDecision(snap.current_replicas + 1, "up", PolicyState(last_up_s=snap.now_s))

    controller = PolicyController(policy_spec_for(Scenario()), policy=count_calls)
    assert [controller(_snap(t, 0)) for t in (0.0, 5.0)] == [3, 3]
    assert seen == [None, 0.0]

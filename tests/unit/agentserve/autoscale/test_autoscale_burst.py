"""Capacity ahead of a burst: the arrival-rate derivative in the predictive floor (burst.py
through decide) and standby replicas (standby.py; the simulator's unrouted pool; the Ray
adapter's routed margin)."""
# ruff: noqa: E501  (one table row per line reads best)

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from agentserve.autoscale.burst import BurstKnobs, BurstState, planned_rate
from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.policy import (
    PolicySpec,
    PolicyState,
    Sla,
    Snapshot,
    TenantLatency,
    decide,
)
from agentserve.autoscale.standby import fleet_target, visible_snapshot
from agentserve_bench.autoscale.compare import PolicyController
from agentserve_bench.autoscale.simulate import SimConfig, simulate
from agentserve_bench.autoscale.trace import Call, Session, Trace, TraceConfig

K = BurstKnobs(lead_s=45.0)
ON = BurstState(since_s=100.0, rate_rps=20.0)
OFF = K._replace(burst_ratio=0.0)
# (name, knobs, now, look-back rps, recent rps, state) -> (planned rps, burst since)
# fmt: off
DETECTOR = [
    ("steady: look-back rate", K, 100.0, 8.0, 8.4, BurstState(), 8.0, None),
    ("unknown recent rate: off", K, 100.0, 8.0, None, ON, 8.0, None),
    ("rising: projected one start ahead", K, 100.0, 9.0, 11.5, BurstState(), 11.5 + 2.5 / 10 * 45, 100.0),
    ("projection capped at x2 recent", K, 100.0, 5.0, 10.0, BurstState(), 20.0, 100.0),
    ("ratio met but noise: quiet deployment", K, 100.0, 0.2, 0.4, BurstState(), 0.2, None),
    ("plan only rises during a burst", K, 110.0, 10.0, 13.0, BurstState(100.0, 30.0), 30.0, 100.0),
    ("plan rises with the rate (x2 cap)", K, 110.0, 10.0, 13.0, ON, 26.0, 100.0),
    ("falling back, within hold: keep plan", K, 130.0, 12.0, 12.5, ON, 20.0, 100.0),
    ("caught up after hold: burst over", K, 170.0, 14.0, 15.0, ON, 14.0, None),
    ("still above exit ratio after hold: keep", K, 170.0, 10.0, 11.5, ON, 20.0, 100.0),
    ("disabled", OFF, 100.0, 5.0, 10.0, BurstState(), 5.0, None),
]
# fmt: on


@pytest.mark.parametrize(
    ("knobs", "now", "long", "recent", "state", "rate", "since"),
    [row[1:] for row in DETECTOR],
    ids=[row[0] for row in DETECTOR],
)
def test_detector_table(knobs, now, long, recent, state, rate, since):
    planned, new = planned_rate(now, long, recent, knobs, state)
    assert planned == pytest.approx(rate) and new.since_s == since


SLAS = {"chat": Sla(1000.0, 60.0)}
MODEL = PolicySpec(
    min_replicas=1,
    max_replicas=16,
    slas=SLAS,
    model=LatencyModel(),
    max_drafted=7,
    burst=K,
    max_num_seqs=8,
)
CALM = {"chat": TenantLatency(500.0, 30.0, 50)}


def snap(now=1000.0, ready=8, rate=8.0, recent=8.0, **kw):
    kw.setdefault("tenants", CALM)
    kw.setdefault("in_flight", 30)
    return Snapshot(
        now,
        ready,
        arrival_rate_rps=rate,
        recent_arrival_rate_rps=recent,
        mean_prompt_tokens=100,
        mean_output_tokens=100,
        **kw,
    )


def test_the_floor_rises_before_latency_does():
    steady = decide(snap(), MODEL)
    rising = decide(snap(rate=9.0, recent=11.5), MODEL)
    without = decide(snap(rate=9.0, recent=11.5), replace(MODEL, burst=K._replace(burst_ratio=0.0)))
    assert steady.target_replicas == 8 and steady.reason in {
        "hold",
        "hold_in_band",
        "hold_downscale_delay",
    }
    assert rising.reason == "burst_floor" and rising.target_replicas > without.target_replicas
    assert rising.capacity_floor > without.capacity_floor
    assert rising.state.burst_since_s == 1000.0


def test_no_oscillation_when_the_burst_ends():
    """Trigger, then the rate falls back: the raised fleet is held through the hold time
    and afterwards shrinks only through the ordinary scale-down rules, never back up."""
    state, targets = PolicyState(), []
    ready = 8
    for i, (rate, recent) in enumerate([(9.0, 11.5)] + [(9.0, 8.0)] * 60):
        now = 1000.0 + 5 * i
        d = decide(snap(now, ready, rate, recent, in_flight=20), MODEL, state)
        state, ready = d.state, d.target_replicas
        targets.append(d.target_replicas)
    peak = targets[0]
    assert peak > 8
    assert all(a >= b for a, b in itertools.pairwise(targets))  # monotone: no 2 <-> 1
    assert targets[12] == peak  # 60 s hold and downscale delay: still raised
    assert state.burst_since_s is None


def test_a_floor_step_keeps_the_breach_timer_running():
    """A small floor scale-up during a breach must not restart the reactive upscale delay."""
    hot = {"chat": TenantLatency(2500.0, 30.0, 50)}
    spec = replace(MODEL, burst=K._replace(burst_ratio=0.0))
    first = decide(
        snap(1000.0, 2, rate=3.0, recent=3.0, tenants=hot, in_flight=14), spec, PolicyState()
    )
    assert first.reason == "capacity_floor" and first.state.up_since_s == 1000.0


def test_standby_is_hidden_from_decide_and_added_to_the_target():
    s = Snapshot(10.0, ready_replicas=5, warming_ages_s=(30.0, 2.0))
    seen = visible_snapshot(s, 3)
    assert (seen.ready_replicas, seen.warming_ages_s) == (4, ())  # newest first
    assert visible_snapshot(Snapshot(10.0, 1), 2).ready_replicas == 1  # one stays ready
    assert fleet_target(3, 2, 16) == 5 and fleet_target(15, 2, 16) == 16
    assert fleet_target(0, 2, 16) == 0  # scale to zero keeps no standby


def test_routed_standby_controller_keeps_the_margin():
    spec = replace(MODEL, standby_replicas=2)
    ctl = PolicyController(spec)
    # 10 running, policy sees 8 and holds: the fleet stays 10
    assert ctl(snap(ready=10, rate=8.0, recent=8.0)) == 10


def _trace(starts: list[float]) -> Trace:
    call = Call(prompt_tokens=100, output_tokens=400, pause_s=0.0, new_tokens=100)
    sessions = tuple(Session(i, "chat", t, (call,)) for i, t in enumerate(starts))
    return Trace(replace(TraceConfig(), duration_s=120.0), sessions)


def test_simulated_standby_is_promoted_at_once_and_costs_replica_seconds():
    trace = _trace([1.0 + 0.01 * i for i in range(36)])
    cfg = SimConfig(initial_replicas=1, replica_start_s=45.0, max_num_seqs=4, interval_s=5.0)
    grow = lambda s: 1 if s.now_s < 5.0 else 3  # noqa: E731
    cold = simulate(trace, grow, cfg)
    warm = simulate(trace, grow, replace(cfg, standby_replicas=2))
    last_cold = max(q.finish_s for q in cold.requests)
    last_warm = max(q.finish_s for q in warm.requests)
    assert last_warm < 45.0 < last_cold  # promoted standby served before any fresh start
    # the two standby replicas cost from t=0, and the pool is refilled after promotion
    assert warm.replica_seconds > cold.replica_seconds
    assert warm.timeline[-1]["standby"] == 2

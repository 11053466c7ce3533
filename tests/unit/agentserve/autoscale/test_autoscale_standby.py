"""Standby headroom derived from the measured replica start (standby.py): the growth
factor, the headroom fleet decide's target rides under, its hold against falling, and
the defaults that turn it on."""

from __future__ import annotations

from dataclasses import replace

import pytest
from agentserve.autoscale.burst import BurstKnobs
from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.policy import (
    PolicySpec,
    PolicyState,
    ScaleDecision,
    Sla,
    Snapshot,
    TenantLatency,
    capacity_floor,
)
from agentserve.autoscale.standby import demand_replicas, headroom_factor, plan_fleet
from agentserve.spec import AutoscalingSpec

K = BurstKnobs(lead_s=49.0)  # ratio 1.2, windows 30 s / 10 s, cap x2
SPEC = PolicySpec(
    min_replicas=1,
    max_replicas=32,
    slas={"chat": Sla(1000.0, 60.0)},
    model=LatencyModel(),
    max_drafted=7,
    burst=K,
    max_num_seqs=8,
)
CALM = {"chat": TenantLatency(500.0, 30.0, 50)}


def snap(now=1000.0, ready=8, rate=8.0, start=49.0, **kw):
    kw.setdefault("tenants", CALM)
    kw.setdefault("in_flight", 30)
    return Snapshot(
        now,
        ready,
        arrival_rate_rps=rate,
        recent_arrival_rate_rps=rate,
        mean_prompt_tokens=100,
        mean_output_tokens=100,
        replica_start_s=start,
        **kw,
    )


@pytest.mark.parametrize(
    ("start_s", "g"),
    [(0.0, 0.3), (10.0, 0.5), (20.0, 0.7), (35.0, 1.0), (49.0, 1.0), (120.0, 1.0)],
)
def test_growth_factor_is_the_unflagged_slope_over_one_start_capped(start_s, g):
    """(burst_ratio - 1) / gap x (start + look_back / 2) = 0.2 / 10 s x (start + 15 s),
    at most burst_max_factor - 1."""
    assert headroom_factor(SPEC, start_s) == pytest.approx(g)


def test_growth_factor_follows_the_detector_knobs():
    off = replace(SPEC, burst=K._replace(burst_ratio=0.0))
    assert headroom_factor(off, 5.0) == pytest.approx(1.0)  # nothing flagged: the cap
    keen = replace(SPEC, burst=K._replace(burst_ratio=1.1))
    assert headroom_factor(keen, 10.0) == pytest.approx(0.25)  # a keener detector: less
    wide = replace(SPEC, burst=K._replace(burst_max_factor=3.0))
    assert headroom_factor(wide, 120.0) == pytest.approx(2.0)


def _holding(seen: Snapshot, spec: PolicySpec, state: PolicyState) -> ScaleDecision:
    """A policy that keeps the fleet it sees (isolates the headroom from decide)."""
    return ScaleDecision(seen.current_replicas, "hold", state)


def test_fleet_is_demand_times_one_plus_g_and_the_margin_is_hidden_next_time():
    s = snap(ready=4, start=10.0)
    demand = capacity_floor(s, SPEC)
    assert demand_replicas(s, SPEC, 99) == demand >= 2
    fleet, decision, seen = plan_fleet(s, SPEC, PolicyState(), _holding)
    assert seen.ready_replicas == 4  # nothing hidden before the first margin
    assert fleet == max(4, -(-3 * demand // 2))  # ceil(1.5 x demand), start 10 s
    assert decision.state.standby_replicas == fleet - 4
    grown = snap(now=1005.0, ready=fleet, start=10.0)
    again, decision, seen = plan_fleet(grown, SPEC, decision.state, _holding)
    assert seen.ready_replicas == 4 and again == fleet  # the margin is not seen, and stays


def test_a_longer_measured_start_keeps_more_headroom():
    short, _, _ = plan_fleet(snap(ready=2, start=10.0), SPEC, PolicyState(), _holding)
    long, _, _ = plan_fleet(snap(ready=2, start=49.0), SPEC, PolicyState(), _holding)
    demand = capacity_floor(snap(), SPEC)
    assert long == 2 * demand > short


def test_a_target_above_the_headroom_is_not_doubled():
    """A burst floor (or a breach) already above (1 + g) x demand is headroom enough."""

    def burst(seen: Snapshot, spec: PolicySpec, state: PolicyState) -> ScaleDecision:
        return ScaleDecision(30, "burst_floor", state)

    fleet, decision, _ = plan_fleet(snap(ready=8), SPEC, PolicyState(), burst)
    assert fleet == 30 and decision.state.standby_replicas == 0


def test_headroom_falls_only_after_the_downscale_delay():
    busy, quiet = 8.0, 2.0
    fleet, d, _ = plan_fleet(snap(rate=busy), SPEC, PolicyState(), _holding)
    high = fleet
    t = 1000.0
    for _ in range(int(SPEC.downscale_delay_s // 5) - 1):  # the rate halves, and holds
        t += 5.0
        fleet, d, _ = plan_fleet(snap(now=t, ready=fleet, rate=quiet), SPEC, d.state, _holding)
        assert fleet == high
    fleet, d, _ = plan_fleet(
        snap(now=1000.0 + SPEC.downscale_delay_s, ready=fleet, rate=quiet),
        SPEC,
        d.state,
        _holding,
    )
    assert fleet < high


def test_an_explicit_count_replaces_the_derivation_and_zero_keeps_none():
    three = replace(SPEC, standby_replicas=3)
    fleet, d, seen = plan_fleet(snap(ready=4), three, PolicyState(), _holding)
    assert seen.ready_replicas == 1 and fleet == 4 and d.state.standby_replicas == 3
    none = replace(SPEC, standby_replicas=0)
    fleet, d, _ = plan_fleet(snap(ready=4), none, PolicyState(), _holding)
    assert fleet == 4 and d.state.standby_replicas == 0


def test_scale_to_zero_keeps_no_headroom():
    def zero(seen: Snapshot, spec: PolicySpec, state: PolicyState) -> ScaleDecision:
        return ScaleDecision(0, "scale_to_zero", state)

    fleet, d, _ = plan_fleet(snap(), SPEC, PolicyState(), zero)
    assert fleet == 0 and d.state.standby_replicas == 0


def test_without_a_latency_model_the_demand_is_what_is_in_flight():
    bare = replace(SPEC, model=None)  # 8 slots x 0.8 fill: 6.4 requests per replica
    fleet, _, _ = plan_fleet(snap(ready=5, in_flight=30), bare, PolicyState(), _holding)
    assert fleet == 10  # ceil(30 / 6.4) = 5 in demand, g = 1
    fleet, _, _ = plan_fleet(snap(ready=5, in_flight=7), bare, PolicyState(), _holding)
    assert fleet == 5  # 2 in demand: (1 + g) x 2 = 4 < the 5 decide keeps
    idle = snap(ready=1, rate=0.0, in_flight=0)
    assert plan_fleet(idle, bare, PolicyState(), _holding)[0] == 1
    assert plan_fleet(idle, SPEC, PolicyState(), _holding)[0] == 1  # idle: no standby


def test_the_default_derives_the_standby():
    assert AutoscalingSpec().standby_replicas is None
    assert PolicySpec().standby_replicas is None
    state = PolicyState.from_dict(PolicyState(standby_replicas=2, headroom_replicas=9).to_dict())
    assert (state.standby_replicas, state.headroom_replicas) == (2, 9)

"""Standby replicas: started replicas kept beyond the policy's target, so that a scale-up
is served at once instead of after a replica start (49 s measured for vLLM on CPU in the
benchmark, 60-120 s on GPU).

Two mechanisms, because Ray Serve cannot do the better one:
- **unrouted standby** (simulator only, `SimConfig.standby_replicas`): replicas started,
  engine loaded, taking no traffic; a scale-up promotes them (routable now) and the pool
  refills with fresh starts; a scale-down parks idle replicas back in the pool. Ray Serve
  2.60 routes to every RUNNING replica of a deployment and has no state for a started
  replica outside the router's candidate set, so this is not available live.
- **routed standby** (live, and in the simulator as the same code path, `plan_fleet`):
  the adapter asks Ray for `decide`'s target plus the margin and hides the margin applied
  at the previous decision from the snapshot `decide` sees (the newest first: warming ones,
  then ready ones, keeping one ready). The extras serve traffic like any replica (their
  cost is the same running replica's), and a scale-up by k is served at once by the hidden
  ones while fresh starts refill the margin. It is standing headroom the policy does not
  consolidate away.
Both count every standby replica's time in replica-seconds. A target of 0 (scale to
zero) gets no standby: the margin accompanies a serving fleet.

**How large (the default, `standby_replicas` None): derived from the replica start.** A
replica asked for now serves one start S later, so whatever the arrival rate grows by
within S must be served by replicas already running. The policy sees growth two ways:
the floor follows the look-back rate (which trails a ramp by half its window, L/2), and
the burst detector flags a rise once the recent rate reaches `burst_ratio` x the
look-back rate, i.e. a relative slope of (burst_ratio - 1) / gap per second, gap being
the distance between the two windows' centres. The steepest rise neither reacts to in
time therefore grows demand by the factor 1 + g within one start,

    g = min(burst_max_factor - 1, (burst_ratio - 1) / gap x (S + L/2)),

the cap being the detector's own bound on a step (it plans for at most burst_max_factor x
the recent rate; a larger step is the detector's and the ingress priority's to absorb).
The fleet runs max(T, ceil((1 + g) x D)): T is decide's target, D the replicas the
current demand needs (the capacity floor at the look-back rate, without the burst
projection; without a latency model the replicas the requests in flight fill, at most T;
0 when idle, so an idle fleet keeps no standby). A target already above (1 + g) x D (a burst
floor, an SLA breach) is headroom enough, so a detected burst is not doubled again. The
headroom fleet rises at once and falls only after staying lower for downscale_delay_s,
the policy's own scale-down hold, so rate noise causes no churn. With the defaults
(ratio 1.2, windows 30 s / 10 s, cap 2) g = 0.02/s x (S + 15 s), capped at 1: a 10 s
start keeps half the demand's fleet again in standby, a start of 35 s or more the whole
of it again (S = 49 s in the benchmark). With the detector off (`burst_ratio` 0) no rise
is flagged and g is the cap. An explicit `standby_replicas` count replaces the
derivation (the fleet is then T + that count).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from agentserve.autoscale.policy import capacity_floor, decide, planned_start_s
from agentserve.autoscale.policy_types import PolicySpec, PolicyState, ScaleDecision, Snapshot

__all__ = ["demand_replicas", "fleet_target", "headroom_factor", "plan_fleet", "visible_snapshot"]


def visible_snapshot(snap: Snapshot, standby: int) -> Snapshot:
    """The snapshot `decide` sees with `standby` replicas hidden: warming ones first (the
    newest replicas are the margin being refilled), then ready ones down to one ready."""
    if standby <= 0:
        return snap
    warming = sorted(snap.warming_ages_s)
    hide_warming = min(standby, len(warming))
    hide_ready = min(standby - hide_warming, max(0, snap.ready_replicas - 1))
    return replace(
        snap,
        ready_replicas=snap.ready_replicas - hide_ready,
        warming_ages_s=tuple(warming[hide_warming:]),
    )


def fleet_target(target: int, standby: int, max_replicas: int) -> int:
    """Replicas to run for a policy target: target + standby, within max_replicas; 0
    stays 0."""
    if target <= 0 or standby <= 0:
        return target
    return min(max_replicas, target + standby)


def headroom_factor(spec: PolicySpec, start_s: float) -> float:
    """g, the relative growth of demand within one replica start `start_s` that neither
    the look-back floor nor the burst detector answers in time (module doc):
    min(burst_max_factor - 1, (burst_ratio - 1) / gap x (start_s + look_back_s / 2)),
    gap = (look_back_s - recent_window_s) / 2; the cap with the detector off; never
    negative."""
    k = spec.burst
    cap = max(0.0, k.burst_max_factor - 1.0)
    if k.burst_ratio <= 0:
        return cap
    gap_s = max(1e-6, (k.look_back_s - k.recent_window_s) / 2)
    slope = max(0.0, k.burst_ratio - 1.0) / gap_s
    return min(cap, slope * (max(0.0, start_s) + k.look_back_s / 2))


PolicyFunction = Callable[[Snapshot, PolicySpec, PolicyState], ScaleDecision]
"""decide's shape: (snapshot, spec, state) -> ScaleDecision."""


def _hidden(spec: PolicySpec, state: PolicyState) -> int:
    """Replicas of the current fleet that are standby: the explicit count, else the
    margin the previous decision added (none before the first)."""
    if spec.standby_replicas is not None:
        return spec.standby_replicas
    return state.standby_replicas or 0


def demand_replicas(snap: Snapshot, spec: PolicySpec, target: int) -> int:
    """Replicas the current demand needs: the capacity floor at the look-back arrival rate
    (no burst projection: a projected rise is growth already planned for); without a
    latency model, the replicas the requests in flight fill at the planned fill
    (max_num_seqs x target_utilization each), at most `target`. 0 when idle."""
    if spec.model is None:
        slots = max(1.0, spec.max_num_seqs * spec.target_utilization)
        return min(target, math.ceil(snap.in_flight / slots - 1e-9))
    return capacity_floor(snap, spec)


def _held_headroom(wanted: int, now_s: float, spec: PolicySpec, state: PolicyState) -> PolicyState:
    """The headroom fleet rises at once and falls only after it has stayed lower for
    downscale_delay_s, the policy's own scale-down hold (no churn on rate noise)."""
    held, since = state.headroom_replicas, state.headroom_since_s
    if held is None or wanted >= held or since is None:
        return replace(state, headroom_replicas=wanted, headroom_since_s=now_s)
    if now_s - since >= spec.downscale_delay_s:
        return replace(state, headroom_replicas=wanted, headroom_since_s=now_s)
    return state


def plan_fleet(
    snap: Snapshot, spec: PolicySpec, state: PolicyState, policy: PolicyFunction = decide
) -> tuple[int, ScaleDecision, Snapshot]:
    """One routed-standby decision, as both the Ray adapter and the simulator run it:
    hide the current margin from `snap`, ask `policy` (decide's shape) for its target T,
    and run max(T, the headroom fleet) within max_replicas: T + `standby_replicas` when
    the spec sets it, else ceil((1 + headroom_factor) x demand_replicas), held against
    falling for downscale_delay_s (a target T already above it, e.g. a burst floor, is
    headroom enough). Returns (replicas to run, the decision with the applied margin in
    its state, the snapshot `policy` saw)."""
    seen = visible_snapshot(snap, _hidden(spec, state))
    decision = policy(seen, spec, state)
    target, new_state = decision.target_replicas, decision.state
    if target <= 0:
        fleet = target
    elif spec.standby_replicas is not None:
        fleet = fleet_target(target, spec.standby_replicas, spec.max_replicas)
    else:
        g = headroom_factor(spec, planned_start_s(seen, spec))
        wanted = math.ceil((1.0 + g) * demand_replicas(seen, spec, target) - 1e-9)
        new_state = _held_headroom(wanted, seen.now_s, spec, new_state)
        fleet = min(spec.max_replicas, max(target, new_state.headroom_replicas or 0))
    new_state = replace(new_state, standby_replicas=max(0, fleet - target))
    return fleet, replace(decision, state=new_state), seen

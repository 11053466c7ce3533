"""Standby replicas: started replicas kept beyond the policy's target, so that a scale-up
is served at once instead of after a replica start (docs/autoscaling.md, "Standby replicas").

Live and in the simulator the same code path (`plan_fleet`) keeps a **routed** margin: the
adapter asks Ray for `decide`'s target plus the margin and hides the margin of the previous
decision from the snapshot `decide` sees (newest first: warming, then ready, keeping one
ready). Unrouted standby (`SimConfig.standby_replicas`) exists in the simulator only: Ray
Serve routes to every RUNNING replica. A target of 0 gets no standby.

Size (`standby_replicas` None): the fleet runs max(T, ceil((1 + g) x D)), T decide's target,
D the replicas current demand needs (0 when idle), g = min(burst_max_factor - 1,
(burst_ratio - 1) / gap x (S + L/2)) for a replica start S and look-back window L (g is the
cap with the burst detector off). It rises at once and falls only after staying lower for
downscale_delay_s. An explicit `standby_replicas` count makes the fleet T + that count.
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

"""Standby replicas: started replicas kept beyond the policy's target, so that a scale-up
is served at once instead of after a replica start (45 s in the benchmark, 60-120 s for
vLLM).

Two mechanisms, because Ray Serve cannot do the better one:
- **unrouted standby** (simulator only, `SimConfig.standby_replicas`): replicas started,
  engine loaded, taking no traffic; a scale-up promotes them (routable now) and the pool
  refills with fresh starts; a scale-down parks idle replicas back in the pool. Ray Serve
  2.60 routes to every RUNNING replica of a deployment and has no state for a started
  replica outside the router's candidate set, so this is not available live.
- **routed standby** (live, and in the simulator as the same code path): the adapter
  asks Ray for `decide`'s target + `standby_replicas` and hides that many replicas from
  the snapshot `decide` sees (the newest first: warming ones, then ready ones, keeping
  one ready). The extras serve traffic like any replica (their cost is the same running
  replica's), and a scale-up by k is served at once by the hidden ones while k fresh
  starts refill the margin. It is standing headroom the policy does not consolidate away.
Both count every standby replica's time in replica-seconds. A target of 0 (scale to
zero) gets no standby: the margin accompanies a serving fleet.
"""

from __future__ import annotations

from dataclasses import replace

from agentserve.autoscale.policy_types import Snapshot

__all__ = ["fleet_target", "visible_snapshot"]


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

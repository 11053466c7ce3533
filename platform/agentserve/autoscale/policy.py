"""Pure SLA autoscaling policy: decide(snapshot, spec, state) -> ScaleDecision (its types
live in policy_types.py and are re-exported here).

Imports neither Ray nor Kubernetes; the Ray Serve adapter and the simulator call the same
`decide`. Two loops set the target: a predictive capacity floor (Little's law with the
latency model's step time and acceptance length at the planned batch size) and a reactive
SLA ratio max over tenants of max(p95 TTFT / SLO, p95 TPOT / SLO) with a hysteresis band.
Contracts of `decide`:
- the target lies in [min_replicas, max_replicas], except 0 after an idle period when
  min_replicas is 0 and scale_to_zero_idle_s is set;
- scale-ups are sized to bring the ratio to the middle of the band; while replicas warm,
  they count as partial capacity and another scale-up happens only if that credited
  capacity still leaves the projected ratio above the upscale threshold;
- never a scale-down while anything warms or drains, within downscale_delay_s of a
  scale-up, or unless the smaller fleet is projected to stay below the band's middle
  (consolidation check: no 2 <-> 1 oscillation);
- with no ready replica and traffic waiting, requests are held at the ingress
  (`hold_requests`) for at most cold_start_hold_timeout_s, then refused with 503;
- no SLA ratio from a window of fewer than MIN_RATIO_REQUESTS requests, no TPOT ratio for
  an SLO the model cannot meet at batch 1, and without a queue no more replicas than
  requests in flight ("hold_saturated");
- a rising arrival rate (recent window vs look-back, burst.py) raises the floor ahead of
  the load, with hysteresis; reason "burst_floor";
- the replica start time (warming credit, burst lead) is the measured one the replicas
  report (Snapshot.replica_start_s) when there is one, else the spec's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from agentserve.autoscale.burst import BurstKnobs, BurstState, planned_rate
from agentserve.autoscale.model import drafted_for, speculation_schedule
from agentserve.autoscale.policy_types import (
    PolicySpec,
    PolicyState,
    ScaleDecision,
    Sla,
    Snapshot,
    TenantLatency,
)

__all__ = ["PolicySpec", "PolicyState", "ScaleDecision", "Sla", "Snapshot", "TenantLatency"]
__all__ += ["capacity_floor", "decide", "planned_start_s", "sla_ratios"]

_CALIBRATION_RANGE = (0.5, 3.0)
MIN_RATIO_REQUESTS = 5
"""Fewer requests than this in the whole deployment's window: no SLA ratio (one long
prompt's own prefill is not a capacity problem; another replica would not shorten it)."""
MIN_START_S = 1.0
"""A start planned as shorter counts as this long (an engine ready at once still waits for
its replica to be placed and started)."""


def sla_ratios(
    tenants: Mapping[str, TenantLatency], spec: PolicySpec
) -> tuple[float | None, float | None]:
    """(TTFT ratio, TPOT ratio): max over tenants of p95 / SLO; None without samples or
    with fewer than MIN_RATIO_REQUESTS requests in the window over all tenants. A TPOT SLO
    the latency model says no batch size meets (its batch-1 TPOT is above it) is left out:
    no number of replicas reaches it, and chasing it would grow the fleet to max_replicas."""
    ttft: float | None = None
    tpot: float | None = None
    if sum(lat.requests for lat in tenants.values()) < MIN_RATIO_REQUESTS:
        return None, None
    for name, lat in tenants.items():
        sla = spec.slas.get(name, spec.default_sla)
        if lat.ttft_p95_ms is not None:
            ttft = max(ttft or 0.0, lat.ttft_p95_ms / sla.ttft_ms)
        if lat.tpot_p95_ms is not None and spec.use_tpot and _reachable(spec, sla.tpot_ms):
            tpot = max(tpot or 0.0, lat.tpot_p95_ms / sla.tpot_ms)
    return ttft, tpot


def _reachable(spec: PolicySpec, tpot_slo_ms: float) -> bool:
    """Whether the modelled TPOT at batch 1 meets the SLO (True without a model)."""
    return spec.model is None or spec.model.tpot_ms(1, _drafted(spec, 1)) <= tpot_slo_ms


def _max_or_none(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _tightest_tpot_ms(snap: Snapshot, spec: PolicySpec) -> float:
    """Smallest TPOT SLO among tenants with traffic (all configured ones if none)."""
    active = [spec.slas.get(n, spec.default_sla).tpot_ms for n, t in snap.tenants.items()]
    configured = [s.tpot_ms for s in spec.slas.values()] or [spec.default_sla.tpot_ms]
    return min(active or configured)


def _drafted(spec: PolicySpec, batch: int) -> int:
    """Drafted tokens the replica runs at `batch`: its own schedule when the spec names one
    (fixed k included), else the model's (speculation shed as the batch grows)."""
    if spec.model is None or spec.max_drafted == 0:
        return 0
    if spec.schedule is not None:
        return drafted_for(spec.schedule, batch)
    schedule = speculation_schedule(spec.model, spec.max_num_seqs, spec.max_drafted)
    return drafted_for(schedule, batch)


def planning_batch(spec: PolicySpec, tpot_target_ms: float) -> int:
    """Largest batch within max_num_seqs x target_utilization whose modelled TPOT meets
    `tpot_target_ms` (1 when none does)."""
    assert spec.model is not None
    cap = max(1, math.floor(spec.max_num_seqs * spec.target_utilization))
    best = 1
    for b in range(1, cap + 1):
        if spec.model.tpot_ms(b, _drafted(spec, b)) <= tpot_target_ms:
            best = b
    return best


def capacity_floor(snap: Snapshot, spec: PolicySpec) -> int:
    """Replicas the arrival rate needs; 0 without a model or traffic. The larger of:
    - utilisation: each request occupies a replica for its prefill (which stalls the whole
      batch) plus output x TPOT / batch, at the planned batch size;
    - slots: Little's law concurrency L = rate x time in system, plus `staffing_z` x sqrt(L)
      for arrival bursts (square-root staffing), in max_num_seqs slots per replica."""
    if spec.model is None or snap.arrival_rate_rps <= 0:
        return 0
    m, rate = spec.model, snap.arrival_rate_rps
    batch = planning_batch(spec, _tightest_tpot_ms(snap, spec) * spec.mid_ratio)
    prefill_s = m.prefill_ms(snap.mean_prompt_tokens) / 1000.0
    tpot_s = m.tpot_ms(batch, _drafted(spec, batch)) / 1000.0
    output = max(1.0, snap.mean_output_tokens)
    by_utilisation = rate * (prefill_s + output * tpot_s / batch)
    concurrency = rate * (prefill_s + output * tpot_s)  # L = lambda * W
    by_slots = (concurrency + spec.staffing_z * math.sqrt(concurrency)) / spec.max_num_seqs
    return math.ceil(max(by_utilisation, by_slots) - 1e-9)


def planned_start_s(snap: Snapshot, spec: PolicySpec) -> float:
    """The replica start time the policy plans with: the measured one the replicas report
    (snap.replica_start_s), else the spec's expected one; at least MIN_START_S."""
    start = spec.replica_start_s if snap.replica_start_s is None else snap.replica_start_s
    return max(MIN_START_S, start)


def _burst_knobs(snap: Snapshot, spec: PolicySpec) -> BurstKnobs:
    """The detector's knobs, projecting one measured replica start ahead when there is one."""
    if snap.replica_start_s is None:
        return spec.burst
    return spec.burst._replace(lead_s=planned_start_s(snap, spec))


def warming_credit(snap: Snapshot, spec: PolicySpec) -> float:
    """Capacity of warming replicas: half a replica at start, rising to one when ready."""
    start = planned_start_s(snap, spec)
    return sum(0.5 + 0.5 * min(1.0, age / start) for age in snap.warming_ages_s)


def _projected_ratio(
    snap: Snapshot, spec: PolicySpec, ttft: float | None, tpot: float | None, n: int
) -> float | None:
    """SLA ratio expected with `n` ready replicas: TTFT scales with load per replica; TPOT
    follows the model at the new batch size, calibrated by the measured ratio (or scales
    with load without a model)."""
    ready = max(1, snap.ready_replicas)
    scale = ready / n
    ttft_n = None if ttft is None else ttft * scale
    if tpot is None or spec.model is None:
        return _max_or_none(ttft_n, None if tpot is None else tpot * scale)
    slo = _tightest_tpot_ms(snap, spec)
    now_b = max(1, math.ceil(snap.in_flight / ready))
    new_b = max(1, math.ceil(snap.in_flight / n))
    modelled_now = spec.model.tpot_ms(now_b, _drafted(spec, now_b)) / slo
    lo, hi = _CALIBRATION_RANGE
    calibration = min(hi, max(lo, tpot / modelled_now))
    tpot_n = calibration * spec.model.tpot_ms(new_b, _drafted(spec, new_b)) / slo
    return _max_or_none(ttft_n, tpot_n)


def _clamp(n: int, spec: PolicySpec) -> int:
    return min(spec.max_replicas, max(spec.min_replicas, n))


def _since(active: bool, since: float | None, now: float) -> float | None:
    """Start time of a condition that must hold: kept while active, reset when not."""
    if not active:
        return None
    return now if since is None else since


def _backlog(snap: Snapshot, spec: PolicySpec) -> bool:
    """At least one replica's worth of requests waits at the ingress."""
    return snap.queued >= spec.max_num_seqs


def _reactive_target(
    snap: Snapshot, spec: PolicySpec, ratios: tuple[float | None, float | None], capacity: float
) -> int:
    """Replicas for an SLA breach. With requests queued, enough to hold everything in
    flight at the planned fill (max_num_seqs x target_utilization). Without a queue, TTFT
    samples describe a backlog already served: scale capacity by the projected TPOT ratio
    over mid-band (at most max_upscale_factor). Without warming replicas at least one more;
    with them, only what their credited capacity does not cover. Without a queue, never
    more replicas than requests in flight: each already has a replica to itself."""
    if snap.queued > 0:
        slots = max(1.0, spec.max_num_seqs * spec.target_utilization)
        desired = math.ceil(snap.in_flight / slots - 1e-9)
    else:
        tpot = (ratios[1] or 0.0) * snap.ready_replicas / capacity
        desired = math.ceil(capacity * min(tpot / spec.mid_ratio, spec.max_upscale_factor) - 1e-9)
    if not snap.warming_ages_s:
        desired = max(desired, snap.current_replicas + 1)
    if snap.queued == 0:
        desired = min(desired, max(snap.current_replicas, math.ceil(snap.in_flight)))
    return desired


def _hold_reason(snap: Snapshot, spec: PolicySpec, hot: bool, up_since: float | None) -> str:
    """Why the up direction holds."""
    if not hot:
        return "hold"
    if snap.warming_ages_s:
        return "hold_in_flight"
    if up_since is None or snap.now_s - up_since < spec.upscale_delay_s:
        return "hold_upscale_delay"
    # a breach, but the fleet is at its bound or has a replica per request in flight
    return "hold_at_max" if snap.current_replicas >= spec.max_replicas else "hold_saturated"


def _scale_up(
    snap: Snapshot,
    spec: PolicySpec,
    state: PolicyState,
    ratios: tuple[float | None, float | None],
    floor: int,
) -> tuple[int, str, PolicyState]:
    """Target >= current for the up direction, the reason, and the updated up timer."""
    current, now = snap.current_replicas, snap.now_s
    capacity = snap.ready_replicas + warming_credit(snap, spec)
    ratio = _max_or_none(*ratios)
    projected = None
    if ratio is not None and snap.ready_replicas > 0:
        projected = ratio * snap.ready_replicas / capacity
    over = (projected is not None and projected > spec.upscale_ratio) or _backlog(snap, spec)
    # nothing ready yet: latencies only show the cold start, which more replicas won't fix
    hot = snap.ready_replicas > 0 and over
    up_since = _since(hot, state.up_since_s, now)
    state = replace(state, up_since_s=up_since)
    reactive = current
    if hot and up_since is not None and now - up_since >= spec.upscale_delay_s:
        reactive = _reactive_target(snap, spec, ratios, capacity)
    target = _clamp(max(reactive, floor, current), spec)
    if target <= current:
        return current, _hold_reason(snap, spec, hot, up_since), state
    reason = "capacity_floor" if floor >= reactive else "sla_ratio"
    # a floor step leaves a breach's timer running: it may be far smaller than the breach
    up_since = up_since if reason == "capacity_floor" else None
    return target, reason, replace(state, up_since_s=up_since, down_since_s=None, last_up_s=now)


def _consolidated(
    snap: Snapshot, spec: PolicySpec, ttft: float | None, tpot: float | None, floor: int
) -> int:
    """Fewest replicas (down to half, floor and min) projected to stay below mid-band."""
    current = snap.current_replicas
    per_replica = max(1, math.floor(spec.max_num_seqs * spec.target_utilization))
    best = current
    for n in range(current - 1, max(spec.min_replicas, floor, 1, (current + 1) // 2) - 1, -1):
        fits = math.ceil(snap.in_flight / n) <= per_replica
        projected = _projected_ratio(snap, spec, ttft, tpot, n)
        if not fits or (projected is not None and projected >= spec.mid_ratio):
            break
        best = n
    return best


def _scale_down(
    snap: Snapshot,
    spec: PolicySpec,
    state: PolicyState,
    ratios: tuple[float | None, float | None],
    floor: int,
) -> tuple[int, str, PolicyState]:
    """Target <= current for the down direction, the reason, and the updated down timer."""
    current, now = snap.current_replicas, snap.now_s
    ratio = _max_or_none(*ratios)
    cold = (ratio is None or ratio < spec.downscale_ratio) and floor < current
    down_since = _since(cold, state.down_since_s, now)
    state = replace(state, down_since_s=down_since)
    if not cold or current <= spec.min_replicas:
        return current, "hold", state
    if snap.warming_ages_s or snap.draining_replicas:
        return current, "hold_in_flight", state
    if state.last_up_s is not None and now - state.last_up_s < spec.downscale_delay_s:
        return current, "hold_cooldown", state
    if down_since is None or now - down_since < spec.downscale_delay_s:
        return current, "hold_downscale_delay", state
    target = _consolidated(snap, spec, *ratios, floor)
    if target >= current:
        return current, "hold_consolidation", state
    return target, "sla_ratio_low", replace(state, down_since_s=None)


def _idle(snap: Snapshot) -> bool:
    return snap.in_flight == 0 and snap.queued == 0 and snap.arrival_rate_rps == 0


def decide(snap: Snapshot, spec: PolicySpec, state: PolicyState | None = None) -> ScaleDecision:
    """The next target replica count for one model deployment (see the module contracts)."""
    state = state or PolicyState()
    ratios = sla_ratios(snap.tenants, spec)
    ratio = _max_or_none(*ratios)
    old = BurstState(state.burst_since_s, state.burst_rate_rps or 0.0)
    rate, burst = planned_rate(
        snap.now_s,
        snap.arrival_rate_rps,
        snap.recent_arrival_rate_rps,
        _burst_knobs(snap, spec),
        old,
    )
    state = replace(state, burst_since_s=burst.since_s, burst_rate_rps=burst.rate_rps or None)
    floor = capacity_floor(replace(snap, arrival_rate_rps=rate), spec)
    state = replace(state, idle_since_s=_since(_idle(snap), state.idle_since_s, snap.now_s))
    current = snap.current_replicas

    def out(target: int, reason: str, new_state: PolicyState) -> ScaleDecision:
        hold = target > 0 and snap.ready_replicas == 0 and not _idle(snap)
        timeout = spec.cold_start_hold_timeout_s if hold else 0.0
        return ScaleDecision(target, reason, new_state, ratio, floor, hold, timeout)

    if current == 0:
        if _idle(snap):
            return out(spec.min_replicas, "idle_at_zero", state)
        return out(_clamp(max(1, floor), spec), "cold_start", replace(state, last_up_s=snap.now_s))
    idle_s = spec.scale_to_zero_idle_s
    idle_since = state.idle_since_s
    zero_ok = spec.min_replicas == 0 and idle_s is not None and idle_since is not None
    if zero_ok and snap.now_s - idle_since >= idle_s and not snap.warming_ages_s:  # type: ignore[operator]
        return out(0, "scale_to_zero", state)
    if not spec.min_replicas <= current <= spec.max_replicas:
        return out(_clamp(current, spec), "bounds", state)
    target, reason, state = _scale_up(snap, spec, state, ratios, floor)
    if target > current:
        bursting = reason == "capacity_floor" and burst.since_s is not None
        return out(target, "burst_floor" if bursting else reason, state)
    target, down_reason, state = _scale_down(snap, spec, state, ratios, floor)
    if target < current:
        return out(target, down_reason, state)
    in_band = ratio is not None and spec.downscale_ratio <= ratio <= spec.upscale_ratio
    if reason == "hold" and down_reason != "hold":
        reason = down_reason
    elif reason == "hold" and in_band:
        reason = "hold_in_band"
    return out(current, reason, state)

"""Pure SLA autoscaling policy: decide(snapshot, spec, state) -> ScaleDecision.

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
- a rising arrival rate (recent window vs look-back, burst.py) raises the floor ahead of
  the load, with hysteresis; reason "burst_floor".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from agentserve.autoscale.burst import BurstKnobs, BurstState, planned_rate
from agentserve.autoscale.model import LatencyModel, drafted_for, speculation_schedule
from agentserve.spec import DeploymentSpec

__all__ = ["PolicySpec", "PolicyState", "ScaleDecision", "Sla", "Snapshot", "TenantLatency"]
__all__ += ["capacity_floor", "decide", "sla_ratios"]

_CALIBRATION_RANGE = (0.5, 3.0)
_OPEN_MODE_SLA = (1000.0, 100.0)


class Sla(NamedTuple):
    """Latency objectives at p95, milliseconds."""

    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class TenantLatency:
    """One tenant over the look-back window. `ttft_p95_ms` includes ingress queue time and
    counts requests still waiting for a first token by their age so far; `tpot_p95_ms` is
    per output token (not per engine step). None = no sample."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    requests: int = 0


@dataclass(frozen=True)
class Snapshot:
    """What the policy sees at `now_s`. `warming_ages_s` has one age per starting replica;
    `draining_replicas` are being removed; rates and means cover the look-back window;
    `in_flight` counts running plus queued requests, `queued` those without a replica;
    `recent_arrival_rate_rps` covers the short burst-detection window (None: unknown)."""

    now_s: float
    ready_replicas: int
    warming_ages_s: tuple[float, ...] = ()
    draining_replicas: int = 0
    tenants: Mapping[str, TenantLatency] = field(default_factory=dict)
    arrival_rate_rps: float = 0.0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0
    in_flight: int = 0
    queued: int = 0
    recent_arrival_rate_rps: float | None = None

    @property
    def current_replicas(self) -> int:
        """Replicas that are, or will be, serving: ready + warming (draining excluded)."""
        return self.ready_replicas + len(self.warming_ages_s)


@dataclass(frozen=True)
class PolicySpec:
    """Policy knobs, normally derived from a DeploymentSpec by `from_deployment`.

    `model` None disables the capacity floor (reactive only); `use_tpot` False ignores
    TPOT (the TTFT-only baseline). `replica_start_s` is the expected cold-start time;
    `staffing_z` the burst headroom of the floor in standard deviations of concurrency;
    `burst` the rate-derivative detector (burst.py); `standby_replicas` extra started
    replicas kept beyond the target (applied by the fleet, see standby.py).
    """

    min_replicas: int = 1
    max_replicas: int = 1
    max_num_seqs: int = 8
    slas: Mapping[str, Sla] = field(default_factory=dict)
    default_sla: Sla = field(default_factory=lambda: Sla(*_OPEN_MODE_SLA))
    upscale_ratio: float = 1.0
    downscale_ratio: float = 0.6
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 120.0
    scale_to_zero_idle_s: float | None = None
    cold_start_hold_timeout_s: float = 120.0
    target_utilization: float = 0.8
    max_drafted: int = 0
    model: LatencyModel | None = None
    replica_start_s: float = 60.0
    max_upscale_factor: float = 2.0
    staffing_z: float = 2.0
    use_tpot: bool = True
    burst: BurstKnobs = field(default_factory=BurstKnobs)
    standby_replicas: int = 0

    @property
    def mid_ratio(self) -> float:
        """The ratio scaling aims for: the middle of the hysteresis band."""
        return (self.upscale_ratio + self.downscale_ratio) / 2

    @classmethod
    def from_deployment(
        cls,
        spec: DeploymentSpec,
        model_name: str | None = None,
        *,
        latency_model: LatencyModel | None = None,
        replica_start_s: float = 60.0,
        tenant_slas: Mapping[str, Any] | None = None,
    ) -> PolicySpec:
        """Knobs for one model of `spec` (the first when `model_name` is None);
        `tenant_slas` (tenant -> SLASpec) replaces the spec's tenants' SLAs when given."""
        model = next((m for m in spec.models if model_name in (None, m.name)), None)
        if model is None:
            raise KeyError(f"model {model_name!r} is not in the spec")
        a = spec.autoscaling
        if tenant_slas is None:
            tenant_slas = {t.name: t.sla for t in spec.tenants}
        return cls(
            min_replicas=model.replicas.min_replicas,
            max_replicas=model.replicas.max_replicas,
            max_num_seqs=model.max_num_seqs,
            slas={n: Sla(s.ttft_p95_ms, s.tpot_p95_ms) for n, s in tenant_slas.items()},
            default_sla=Sla(a.open_mode_sla.ttft_p95_ms, a.open_mode_sla.tpot_p95_ms),
            upscale_ratio=a.upscale_sla_ratio,
            downscale_ratio=a.downscale_sla_ratio,
            upscale_delay_s=a.upscale_delay_s,
            downscale_delay_s=a.downscale_delay_s,
            scale_to_zero_idle_s=a.scale_to_zero_idle_s,
            cold_start_hold_timeout_s=a.cold_start_hold_timeout_s,
            target_utilization=a.target_utilization,
            max_drafted=model.drafter.num_speculative_tokens if model.drafter.enabled else 0,
            model=latency_model,
            replica_start_s=replica_start_s,
            burst=BurstKnobs(
                burst_ratio=a.burst_ratio, look_back_s=a.look_back_period_s, lead_s=replica_start_s
            ),
            standby_replicas=a.standby_replicas,
        )


@dataclass(frozen=True)
class PolicyState:
    """Timers carried between decisions (JSON-able: Ray keeps it in policy_state)."""

    up_since_s: float | None = None
    down_since_s: float | None = None
    last_up_s: float | None = None
    idle_since_s: float | None = None
    burst_since_s: float | None = None
    burst_rate_rps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyState:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ScaleDecision:
    """The target replica count, why, and the state for the next call."""

    target_replicas: int
    reason: str
    state: PolicyState
    sla_ratio: float | None = None
    capacity_floor: int = 0
    hold_requests: bool = False
    hold_timeout_s: float = 0.0


def sla_ratios(
    tenants: Mapping[str, TenantLatency], spec: PolicySpec
) -> tuple[float | None, float | None]:
    """(TTFT ratio, TPOT ratio): max over tenants of p95 / SLO; None without samples."""
    ttft: float | None = None
    tpot: float | None = None
    for name, lat in tenants.items():
        sla = spec.slas.get(name, spec.default_sla)
        if lat.ttft_p95_ms is not None:
            ttft = max(ttft or 0.0, lat.ttft_p95_ms / sla.ttft_ms)
        if lat.tpot_p95_ms is not None and spec.use_tpot:
            tpot = max(tpot or 0.0, lat.tpot_p95_ms / sla.tpot_ms)
    return ttft, tpot


def _max_or_none(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _tightest_tpot_ms(snap: Snapshot, spec: PolicySpec) -> float:
    """Smallest TPOT SLO among tenants with traffic (all configured ones if none)."""
    active = [spec.slas.get(n, spec.default_sla).tpot_ms for n, t in snap.tenants.items()]
    configured = [s.tpot_ms for s in spec.slas.values()] or [spec.default_sla.tpot_ms]
    return min(active or configured)


def _drafted(spec: PolicySpec, batch: int) -> int:
    if spec.model is None or spec.max_drafted == 0:
        return 0
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


def warming_credit(snap: Snapshot, spec: PolicySpec) -> float:
    """Capacity of warming replicas: half a replica at start, rising to one when ready."""
    return sum(0.5 + 0.5 * min(1.0, age / spec.replica_start_s) for age in snap.warming_ages_s)


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
    with them, only what their credited capacity does not cover."""
    if snap.queued > 0:
        slots = max(1.0, spec.max_num_seqs * spec.target_utilization)
        desired = math.ceil(snap.in_flight / slots - 1e-9)
    else:
        tpot = (ratios[1] or 0.0) * snap.ready_replicas / capacity
        desired = math.ceil(capacity * min(tpot / spec.mid_ratio, spec.max_upscale_factor) - 1e-9)
    if not snap.warming_ages_s:
        desired = max(desired, snap.current_replicas + 1)
    return desired


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
        reason = (
            "hold" if not hot else "hold_in_flight" if snap.warming_ages_s else "hold_upscale_delay"
        )
        return current, reason, state
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
        snap.now_s, snap.arrival_rate_rps, snap.recent_arrival_rate_rps, spec.burst, old
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
            return out(0 if spec.min_replicas == 0 else spec.min_replicas, "idle_at_zero", state)
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

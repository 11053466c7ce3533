"""The policy's data types: inputs (Snapshot, TenantLatency), knobs (PolicySpec, Sla),
carried state (PolicyState) and output (ScaleDecision). Kept apart from policy.py (the
decision logic) so both stay short; policy.py re-exports them, import from either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from agentserve.autoscale.burst import BurstKnobs
from agentserve.autoscale.model import LatencyModel
from agentserve.spec import (
    AutoscalingSpec,
    DeploymentSpec,
    ModelNotInSpecError,
    ModelSpec,
    ReplicaSpec,
)

__all__ = ["PolicySpec", "PolicyState", "ScaleDecision", "Sla", "Snapshot", "TenantLatency"]
__all__ += ["replica_schedule"]

# The knobs' defaults are the spec's (one source): a PolicySpec() decides as
# PolicySpec.from_deployment does for a spec that sets nothing.
_AUTOSCALING = AutoscalingSpec()
_REPLICAS = ReplicaSpec()
_MAX_NUM_SEQS: int = ModelSpec().engine_slots  # a CPU replica's
DEFAULT_REPLICA_START_S = 60.0
"""Expected cold-start time of a replica when neither the replicas (Snapshot.replica_start_s)
nor the engine (its expected_start_s) says otherwise."""


class Sla(NamedTuple):
    """Latency objectives at p95, milliseconds."""

    ttft_ms: float
    tpot_ms: float

    def seconds(self) -> tuple[float, float]:
        """(TTFT, TPOT) objectives in seconds (as spec.SLASpec.seconds)."""
        return self.ttft_ms / 1000.0, self.tpot_ms / 1000.0


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
    `recent_arrival_rate_rps` covers the short burst-detection window (None: unknown);
    `replica_start_s` is the measured replica start (construction to engine ready, seconds:
    start_stat.measured_start_s over the replicas' reports; None: nothing reported, the
    policy plans with PolicySpec.replica_start_s)."""

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
    replica_start_s: float | None = None

    @property
    def current_replicas(self) -> int:
        """Replicas that are, or will be, serving: ready + warming (draining excluded)."""
        return self.ready_replicas + len(self.warming_ages_s)


@dataclass(frozen=True)
class PolicySpec:
    """Policy knobs, normally derived from a DeploymentSpec by `from_deployment`.

    `model` None disables the capacity floor (reactive only); `use_tpot` False ignores
    TPOT (the TTFT-only baseline). `replica_start_s` is the expected cold-start time, the
    fallback until replicas report a measured one (Snapshot.replica_start_s), and
    `burst.lead_s` likewise;
    `staffing_z` the burst headroom of the floor in standard deviations of concurrency;
    `burst` the rate-derivative detector (burst.py); `standby_replicas` extra started
    replicas kept beyond the target (applied by the fleet, see standby.py): None derives
    the margin from the replica start (standby.plan_fleet), a number fixes it. `schedule` is
    what the replica drafts by batch size ([(start, end, k)], as the drafter's
    num_speculative_tokens_per_batch_size); None = the model's own schedule for
    `max_drafted`, so the policy plans the capacity the replica really has.
    """

    min_replicas: int = _REPLICAS.min_replicas
    max_replicas: int = _REPLICAS.max_replicas
    max_num_seqs: int = _MAX_NUM_SEQS
    slas: Mapping[str, Sla] = field(default_factory=dict)
    default_sla: Sla = field(
        default_factory=lambda: Sla(
            _AUTOSCALING.open_mode_sla.ttft_p95_ms, _AUTOSCALING.open_mode_sla.tpot_p95_ms
        )
    )
    upscale_ratio: float = _AUTOSCALING.upscale_sla_ratio
    downscale_ratio: float = _AUTOSCALING.downscale_sla_ratio
    upscale_delay_s: float = _AUTOSCALING.upscale_delay_s
    downscale_delay_s: float = _AUTOSCALING.downscale_delay_s
    scale_to_zero_idle_s: float | None = _AUTOSCALING.scale_to_zero_idle_s
    cold_start_hold_timeout_s: float = _AUTOSCALING.cold_start_hold_timeout_s
    target_utilization: float = _AUTOSCALING.target_utilization
    max_drafted: int = 0
    model: LatencyModel | None = None
    replica_start_s: float = DEFAULT_REPLICA_START_S
    max_upscale_factor: float = 2.0
    staffing_z: float = 2.0
    use_tpot: bool = True
    burst: BurstKnobs = field(
        default_factory=lambda: BurstKnobs(
            burst_ratio=_AUTOSCALING.burst_ratio,
            look_back_s=_AUTOSCALING.look_back_period_s,
            lead_s=DEFAULT_REPLICA_START_S,
        )
    )
    standby_replicas: int | None = _AUTOSCALING.standby_replicas
    schedule: tuple[tuple[int, int, int], ...] | None = None
    interval_s: float = _AUTOSCALING.interval_s  # between live decisions (ray_policy.py)

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
        replica_start_s: float = DEFAULT_REPLICA_START_S,
        tenant_slas: Mapping[str, Any] | None = None,
    ) -> PolicySpec:
        """Knobs for one model of `spec` (the first when `model_name` is None);
        `tenant_slas` (tenant -> SLASpec) replaces the spec's tenants' SLAs when given."""
        model = next((m for m in spec.models if model_name in (None, m.name)), None)
        if model is None:
            raise ModelNotInSpecError(f"model {model_name!r} is not in the spec")
        a = spec.autoscaling
        if tenant_slas is None:
            tenant_slas = {t.name: t.sla for t in spec.tenants}
        return cls(
            min_replicas=model.replicas.min_replicas,
            max_replicas=model.replicas.max_replicas,
            max_num_seqs=model.engine_slots,
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
            schedule=replica_schedule(model),
            model=latency_model,
            replica_start_s=replica_start_s,
            burst=BurstKnobs(
                burst_ratio=a.burst_ratio, look_back_s=a.look_back_period_s, lead_s=replica_start_s
            ),
            standby_replicas=a.standby_replicas,
            interval_s=a.interval_s,
        )


@dataclass(frozen=True)
class PolicyState:
    """Timers carried between decisions, and the standby margin last added (hidden from
    the next snapshot, standby.plan_fleet). JSON-able: Ray keeps it in policy_state."""

    up_since_s: float | None = None
    down_since_s: float | None = None
    last_up_s: float | None = None
    idle_since_s: float | None = None
    burst_since_s: float | None = None
    burst_rate_rps: float | None = None
    standby_replicas: int | None = None  # the standby margin the last decision added
    headroom_replicas: int | None = None  # the derived headroom fleet held (standby.py)
    headroom_since_s: float | None = None  # when it was last raised or lowered

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


def replica_schedule(model: ModelSpec) -> tuple[tuple[int, int, int], ...] | None:
    """What the model's replica drafts by batch size: the drafter's
    num_speculative_tokens_per_batch_size (deployments fill it by default,
    speculation.schedule.with_default_schedules), else num_speculative_tokens at every batch;
    None without a drafter."""
    drafter = model.drafter
    if not drafter.enabled:
        return None
    ranges = drafter.num_speculative_tokens_per_batch_size
    if ranges is None:
        return ((1, model.engine_slots, drafter.num_speculative_tokens),)
    return tuple((start, end, k) for start, end, k in ranges)

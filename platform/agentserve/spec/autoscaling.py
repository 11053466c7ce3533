"""AutoscalingSpec: how replicas follow load (the SLA policy's knobs, or Ray Serve's own)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentserve.spec.base import _Spec
from agentserve.spec.tenants import SLASpec


class AutoscalingSpec(_Spec):
    """How replicas follow load. SLA ratio = max over tenants of p95 latency / SLO."""

    policy: Literal["sla", "ray_default"] = Field("sla", description="sla, or Ray Serve's own.")
    upscale_sla_ratio: float = Field(1.0, gt=0, description="Scale up above this SLA ratio.")
    downscale_sla_ratio: float = Field(0.6, gt=0, description="Scale down below this SLA ratio.")
    interval_s: float = Field(
        5.0,
        gt=0,
        description="Seconds between the SLA policy's decisions (Ray calls it every "
        "control-loop tick; the target stands in between).",
    )
    look_back_period_s: float = Field(
        30.0,
        gt=0,
        description="Seconds of history each decision sees: replicas' p95 latency windows "
        "and Ray Serve's metric averaging.",
    )
    upscale_delay_s: float = Field(10.0, ge=0, description="Upscale condition hold, seconds.")
    downscale_delay_s: float = Field(120.0, ge=0, description="Downscale condition hold, s.")
    scale_to_zero_idle_s: float | None = Field(
        None, gt=0, description="Idle seconds before going to zero replicas; null = never."
    )
    cold_start_hold_timeout_s: float = Field(
        120.0, gt=0, description="Seconds a request waits for a replica starting from zero."
    )
    target_utilization: float = Field(
        0.8, gt=0, le=1, description="Fraction of replica capacity (max_num_seqs) to plan for."
    )
    open_mode_sla: SLASpec = Field(
        default_factory=SLASpec, description="SLA used when no tenants are configured."
    )
    burst_ratio: float = Field(
        1.2,
        ge=0,
        description="Burst detection: when the arrival rate over the last 10 s reaches this "
        "multiple of the look-back rate (and beyond Poisson noise), the capacity floor plans "
        "for the rate projected one replica start ahead; 0 = off. Policy sla only.",
    )
    standby_replicas: int | None = Field(
        None,
        ge=0,
        description="Started replicas kept beyond the policy's target, so a scale-up does "
        "not wait for a replica start. null = derived from the measured replica start: "
        "enough for the demand growth within one start that neither the look-back floor "
        "nor the burst detector answers in time (up to one more fleet at the burst "
        "detector's 2x cap; docs/autoscaling.md). Ray Serve routes to every running "
        "replica, so these serve traffic too; they cost replica-seconds all the time; 0 = "
        "none. Policy sla only.",
    )

    @model_validator(mode="after")
    def _check_band(self) -> AutoscalingSpec:
        if self.downscale_sla_ratio >= self.upscale_sla_ratio:
            raise ValueError(
                f"downscale_sla_ratio ({self.downscale_sla_ratio}) must be smaller than "
                f"upscale_sla_ratio ({self.upscale_sla_ratio}) to leave a hysteresis band"
            )
        return self

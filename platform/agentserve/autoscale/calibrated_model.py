"""The capacity model from the step costs calibrated on the machine the replicas run on
(docs/autoscaling.md, "Where the step costs come from").

`latency_model_from_profile(profile, dtype, method, base)` turns a step-cost profile
(engine/step_costs.py: GEMM costs of decode and 1..8-token verification steps at batch 1 and
4, per dtype) into a LatencyModel: base, knee and per-token cost fitted to the profile's
rows in the dtype served, times its served step factor; the speculative step factors from
speculation.choice (so the schedule and the calibrated choice weigh a verification step
alike); prefill and acceptance from `base`. Beyond 4 x 8 rows the fit extrapolates.

`calibrated_latency_model(model, base, machine)` picks, in order: the step costs measured
through the server for its kind of CPU (the profile's served_fit); None where the
whole-engine fit holds (a profile with `engine_steps`: model.whole_engine_measurements);
this machine's cached calibration; else the step terms recorded in its kind's profile. No
model is invented for a GPU without a measured profile.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from agentserve import profiles
from agentserve.autoscale.model import (
    LatencyModel,
    Measurement,
    fit,
    whole_engine_measurements,
)
from agentserve.autoscale.served_fit import served_latency_model
from agentserve.drafters import BUNDLED_DRAFTER_DIR
from agentserve.spec import BUNDLED_MODEL, DFLASH_METHODS, ModelSpec
from agentserve.speculation.choice import drafter_fraction, speculative_step_factor

__all__ = [
    "calibrated_latency_model",
    "latency_model_from_profile",
    "measured_step_factor",
    "step_terms",
]

StepTerms = tuple[float, float, float]  # (base_ms, knee_tokens, per_token_ms) of the GEMMs


def measured_step_factor() -> float:
    """A served plain decode step at concurrency 1 over the profile's GEMM decode step at
    batch 1, the largest over the kinds of CPU with both (agentserve_bench/served_fits.py over
    docs/benchmarks/calibration.json and speculative.json): the pooled profile's; 1.0 (the
    GEMMs alone) where unmeasured."""
    factors = profiles.section(profiles.POOLED, "served_factor")
    return 1.0 if factors is None else factors.step


def step_terms(profile: Mapping[str, Any], dtype: str) -> StepTerms:
    """(base_ms, knee_tokens, per_token_ms) fitted to the profile's step costs in `dtype`."""
    records = [
        Measurement(int(batch), int(tokens) - 1, float(ms))
        for batch, by_tokens in profile["dtypes"][dtype]["step_ms"].items()
        for tokens, ms in by_tokens.items()
    ]
    fitted = fit(records)
    return fitted.base_ms, fitted.knee_tokens, fitted.per_token_ms


def _from_terms(
    terms: StepTerms, method: str | None, base: LatencyModel, step_factor: float
) -> LatencyModel:
    base_ms, knee, per_token = terms
    # the drafting cost of DFlash: the shipped drafter's, whose acceptance the model uses too
    uses_drafter = method in DFLASH_METHODS
    draft = (drafter_fraction(BUNDLED_DRAFTER_DIR) or 0.0) if uses_drafter else 0.0
    return dataclasses.replace(
        base,
        base_ms=round(base_ms * step_factor, 3),
        knee_tokens=knee,
        per_token_ms=round(per_token * step_factor, 4),
        speculative_step_factor=round(speculative_step_factor(method, draft), 4),
        speculative_step_factor_loaded=(
            round(speculative_step_factor(method, draft, True), 4) if method else None
        ),
        drafter_every_step=uses_drafter,
    )


def latency_model_from_profile(
    profile: Mapping[str, Any],
    dtype: str,
    method: str | None,
    base: LatencyModel | None = None,
    step_factor: float | None = None,
) -> LatencyModel:
    """The LatencyModel of a replica serving in `dtype` and drafting with `method` (None:
    plain) on the machine `profile` was measured on; see the module docstring for which
    term comes from which measurement. `base` (default LatencyModel()) gives prefill and
    acceptance; `step_factor` (default measured_step_factor()) scales the GEMM step."""
    factor = measured_step_factor() if step_factor is None else step_factor
    return _from_terms(step_terms(profile, dtype), method, base or LatencyModel(), factor)


def _served_dtype(model: ModelSpec) -> str:
    # "auto" serves the bundled model in its config's dtype: bfloat16
    return "bfloat16" if model.dtype == "auto" else model.dtype


def _cached_profile(cpu) -> dict[str, Any] | None:
    """This machine's cached calibration of the bundled model (engine/step_costs.py), if any
    (read only: measuring is `agentserve up`'s job)."""
    from agentserve.engine.step_costs import PROFILE_VERSION, profile_cache_path
    from agentserve.sources.models import cache_root

    root = cache_root()
    path = profile_cache_path(root / "models" / BUNDLED_MODEL, cpu, root)
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return profile if profile.get("version") == PROFILE_VERSION else None


def _read_cpu_info():
    from agentserve.engine.cpu_info import read_cpu_info

    return read_cpu_info()


def calibrated_latency_model(
    model: ModelSpec, base: LatencyModel, machine: str | None = None
) -> LatencyModel | None:
    """`model`'s LatencyModel on the machine its replicas run on: its served fit
    (its profile's served_fit: the whole step measured through the server) where that kind of
    CPU has one, else from the calibrated step costs there; None where there is neither (or
    AGENTSERVE_CALIBRATE=0, or the whole-engine fit holds there). `machine`: that machine's
    kind (a cpu_class, "cuda"); None = this machine (its cached calibration first).
    Profiles and fits are of the bundled model only (the one measured)."""
    if os.environ.get("AGENTSERVE_CALIBRATE", "1") == "0" or model.source != BUNDLED_MODEL:
        return None
    method = model.drafter.method if model.drafter.enabled else None
    dtype = _served_dtype(model)
    cpu = None
    if model.replicas.num_gpus > 0:
        machine = "cuda"  # the CPU here says nothing about a GPU replica
    elif machine is None:
        cpu = _read_cpu_info()
        machine = cpu.cpu_class
    draft = drafter_fraction(BUNDLED_DRAFTER_DIR) if method in DFLASH_METHODS else None
    served = served_latency_model(machine, dtype, base, draft)
    if served is not None:
        return served
    if whole_engine_measurements(machine):
        return None
    profile = None if cpu is None else _cached_profile(cpu)
    if profile is not None and dtype in profile["dtypes"]:
        return latency_model_from_profile(profile, dtype, method, base)
    terms = (profiles.section(machine, "step_terms") or {}).get(dtype)
    if terms is None:
        return None
    recorded = (terms.base_ms, terms.knee_tokens, terms.per_token_ms)
    return _from_terms(recorded, method, base, measured_step_factor())

"""The bundled model's step costs measured through the served API, per kind of CPU
(docs/autoscaling.md, "Where the step costs come from").

`agentserve bench fit-latency` against `agentserve up --no-drafter` fits the whole served
step (`base_ms`, `knee_tokens`, `per_token_ms` from the time per output token at concurrency
1, 2, 4, 8; `prefill_ms_per_token` from TTFTs) into that kind's profile
(profiles/<cpu_class>.json `served_fit`, under the dtype `up` serves in). Where a kind has
one, the capacity model and the default speculation schedule plan with it ahead of a model
derived from GEMM step costs (calibrated_model.py). A verification pass of t tokens per
sequence is priced as a step of t times the tokens; a DFlash drafter adds its share of the
target's layers to every step.
"""

from __future__ import annotations

import dataclasses

from agentserve import profiles
from agentserve.autoscale.model import LatencyModel

__all__ = ["FILE_PREFIX", "TERMS", "served_latency_model"]

TERMS = ("base_ms", "knee_tokens", "per_token_ms", "prefill_ms_per_token")
FILE_PREFIX = "fit_latency_"


def served_latency_model(
    machine: str, dtype: str, base: LatencyModel, draft_fraction: float | None = None
) -> LatencyModel | None:
    """`base` (its acceptance) with the step and prefill costs served on `machine` (a
    cpu_class) in `dtype`, or None where none were measured. `draft_fraction`: a DFlash
    drafter's layers as a share of the target's (None: no drafter), added to every step
    when `base.drafter_every_step`."""
    terms = (profiles.section(machine, "served_fit") or {}).get(dtype)
    if terms is None:
        return None
    drafter = 1.0 + (draft_fraction or 0.0) if base.drafter_every_step else 1.0
    return dataclasses.replace(
        base,
        base_ms=terms.base_ms,
        knee_tokens=terms.knee_tokens,
        per_token_ms=terms.per_token_ms,
        prefill_ms_per_token=terms.prefill_ms_per_token,
        speculative_step_factor=round(drafter, 4),
        speculative_step_factor_loaded=None,
    )

"""The bundled model's step costs measured through the served API, per kind of CPU.

`agentserve bench fit-latency` run against `agentserve up --no-drafter` on a kind of CPU
(the dtype and engine settings `agentserve up` applies there, nothing else running) streams
unique prompts at concurrency 1, 2, 4, 8 and fits the whole served step: `base_ms`,
`knee_tokens`, `per_token_ms` from the time per output token at each concurrency, and
`prefill_ms_per_token` from the TTFT of short and long prompts. Its figures file is
committed as docs/benchmarks/fit_latency_<cpu_class>.json; SERVED_FITS holds their
`latency_model` sections (tests/unit/agentserve/autoscale/test_served_fit.py holds it
equal to the files).

Where a kind of CPU has one, the capacity model (the SLA policy's TPOT and TTFT
projections) and the default speculation schedule plan with it ahead of a model derived
from GEMM step costs (calibrated_model.py): the served figures first, then calibration, as
for speculation. On an AVX2 EPYC the GEMM-derived model was 12-36% short of a served step
and assumed half the prefill cost (docs/benchmarks.md, "Step costs through the served
API"). A verification pass of t tokens per sequence is priced as a step of t times the
tokens (the fit's knee and per-token slope, measured from batches of sequences); a DFlash
drafter's forward adds its share of the target's layers to every step, drafting or not.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from agentserve.autoscale.model import LatencyModel

__all__ = ["SERVED_FITS", "read_served_fits", "served_latency_model"]

FitTerms = tuple[float, float, float, float]  # base_ms, knee_tokens, per_token_ms, prefill
TERMS = ("base_ms", "knee_tokens", "per_token_ms", "prefill_ms_per_token")
FILE_PREFIX = "fit_latency_"

# {cpu_class: {dtype: terms}}: the bundled model served by `agentserve up --no-drafter`
# (docs/benchmarks/fit_latency_<cpu_class>.json, in the dtype `up` serves on that kind)
SERVED_FITS: dict[str, dict[str, FitTerms]] = {
    "avx2": {"float32": (38.398, 2.0, 4.3201, 2.1455)},
    "avx512_bf16": {"bfloat16": (24.041, 0.0, 0.7797, 0.8958)},
}


def read_served_fits(bench_dir: Path) -> dict[str, dict[str, FitTerms]]:
    """SERVED_FITS as the committed figures files in `bench_dir` give it: each
    fit_latency_<cpu_class>.json's `latency_model`, under the dtype `agentserve up` serves
    the bundled model in on that kind of CPU."""
    from agentserve.drafters import DEFAULT_DTYPE
    from agentserve.spec import BUNDLED_MODEL

    out: dict[str, dict[str, FitTerms]] = {}
    for path in sorted(bench_dir.glob(f"{FILE_PREFIX}*.json")):
        kind = path.stem.removeprefix(FILE_PREFIX)
        section = json.loads(path.read_text(encoding="utf-8"))["latency_model"]
        dtype = DEFAULT_DTYPE.get((BUNDLED_MODEL, kind), "bfloat16")
        out[kind] = {dtype: tuple(float(section[t]) for t in TERMS)}  # type: ignore[dict-item]
    return out


def served_latency_model(
    machine: str, dtype: str, base: LatencyModel, draft_fraction: float | None = None
) -> LatencyModel | None:
    """`base` (its acceptance) with the step and prefill costs served on `machine` (a
    cpu_class) in `dtype`, or None where none were measured. `draft_fraction`: a DFlash
    drafter's layers as a share of the target's (None: no drafter), added to every step
    when `base.drafter_every_step`."""
    terms = SERVED_FITS.get(machine, {}).get(dtype)
    if terms is None:
        return None
    base_ms, knee, per_token, prefill = terms
    drafter = 1.0 + (draft_fraction or 0.0) if base.drafter_every_step else 1.0
    return dataclasses.replace(
        base,
        base_ms=base_ms,
        knee_tokens=knee,
        per_token_ms=per_token,
        prefill_ms_per_token=prefill,
        speculative_step_factor=round(drafter, 4),
        speculative_step_factor_loaded=None,
    )

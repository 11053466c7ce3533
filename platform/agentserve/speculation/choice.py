"""Choose dtype, speculative method and drafted tokens from a machine's step costs (pure).

A speculative step of k drafted tokens emits tau(k) tokens per sequence (the method's
measured acceptance, speculation/schedule.py method_acceptance) and costs a
verification pass of 1 + k tokens plus the drafting. Its speed against plain decoding is

    speedup(k, batch) = tau(k, batch) x decode(batch) / (verify(batch, k) + draft(batch, k))

with decode and verify from the machine's step-cost profile (engine/step_costs.py). Step
costs there are the GEMM part of a step; the served benchmark shows what vLLM's whole step
adds, so a `served_factor` (measured served speedup / speedup predicted from the profile, at
most 1) scales every prediction down on machines where that was measured: one fitted at
concurrency 1 for batch 1, one at LOADED_BATCH for the loaded check (vLLM's fixed cost per
step weighs less in a bigger batch, so one factor for both under-predicts the loaded case:
on an AVX-512 EPYC it predicted n-gram at 0.88x plain at batch 4, served 1.42-1.99x).

`choose` scores each (dtype, method, k) by the time of a nominal agent turn (prefill of the
prompt, then the output at batch 1) and keeps plain decoding unless speculation is at least
`min_gain` faster at batch 1 and not slower at batch 4. The dtype is part of the choice: on
CPUs without bf16 instructions float32 verification and prefill can beat bf16.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentserve import profiles
from agentserve.autoscale.model import LOADED_FACTOR_BATCH, geometric_tau

__all__ = [
    "Choice",
    "choose",
    "choose_served",
    "drafter_fraction",
    "ks_timed",
    "measured_served_factors",
    "predicted_speedup",
    "speculative_step_factor",
]

MIN_GAIN = 1.15  # speculation must be predicted this much faster than plain at batch 1
NOMINAL_PROMPT, NOMINAL_OUTPUT = 512, 128  # an agent turn: tool results in, a reply out
LOADED_BATCH = LOADED_FACTOR_BATCH  # "not slower under load" is checked here (4)


@dataclass(frozen=True)
class Choice:
    dtype: str
    method: str | None  # None: plain decoding
    num_speculative_tokens: int
    predicted_speedup: float  # at batch 1, against plain decoding in the chosen dtype
    predicted_speedup_loaded: float  # at LOADED_BATCH
    reason: str
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _step(profile: Mapping[str, Any], dtype: str, batch: int, tokens: int) -> float:
    return float(profile["dtypes"][dtype]["step_ms"][str(batch)][str(tokens)])


def ks_timed(profile: Mapping[str, Any], dtype: str, batch: int) -> list[int]:
    """The drafted-token counts whose verification the profile timed at `batch`."""
    return sorted(int(n) - 1 for n in profile["dtypes"][dtype]["step_ms"][str(batch)] if n != "1")


def predicted_speedup(
    profile: Mapping[str, Any],
    dtype: str,
    batch: int,
    k: int,
    tau: float,
    draft_fraction: float = 0.0,
) -> float:
    """tau x decode / (verify(k) + draft): the speed of speculation against plain decoding
    in `dtype` at `batch`, from the profile's step costs; draft = `draft_fraction` of a
    verification pass of the same size (0 for prompt lookup, the drafter's share of the
    target's layers for a DFlash drafter)."""
    decode = _step(profile, dtype, batch, 1)
    verify = max(decode, _step(profile, dtype, batch, k + 1))  # never cheaper than 1 token:
    return tau * decode / (verify * (1.0 + draft_fraction))  # below is timing noise


def measured_served_factors() -> tuple[dict[str, float], dict[str, float]]:
    """({method: served factor at concurrency 1}, {the same at LOADED_BATCH}) as the pooled
    profile records them (agentserve_bench/served_fits.py over docs/benchmarks/calibration.json and
    speculative.json with the shipped drafter's draft fraction); empty where unmeasured."""
    factors = profiles.section(profiles.POOLED, "served_factor")
    return ({}, {}) if factors is None else (dict(factors.batch_1), dict(factors.loaded))


def speculative_step_factor(
    method: str | None, draft_fraction: float = 0.0, loaded: bool = False
) -> float:
    """What a speculative step of `method` costs against the verification GEMMs the profile
    predicts: the drafting (`draft_fraction` of a verification pass) and what the rest of
    vLLM's step adds (1 / the measured served factor; `loaded`: the one at LOADED_BATCH
    where measured); 1.0 for a method without a served factor."""
    first, at_load = measured_served_factors()
    if method not in first:
        return 1.0
    factor = at_load.get(method, first[method]) if loaded else None
    return (1.0 + draft_fraction) / (factor or first[method])


def drafter_fraction(drafter_dir: Path | None) -> float | None:
    """A DFlash drafter's layers as a share of its target's (its drafting cost), or None."""
    if drafter_dir is None:
        return None
    try:
        config = json.loads((drafter_dir / "config.json").read_text(encoding="utf-8"))
        return config["num_hidden_layers"] / config["num_target_layers"]
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        return None


def choose(
    profile: Mapping[str, Any],
    acceptance: Mapping[str, tuple[float, float]],
    draft_fraction: Mapping[str, float] | None = None,
    served_factor: Mapping[str, float] | None = None,
    min_gain: float = MIN_GAIN,
    ks: Collection[int] | None = None,
    served_factor_loaded: Mapping[str, float] | None = None,
) -> Choice:
    """The dtype, method and k with the shortest nominal agent turn on this profile.

    `acceptance`: {method: (alpha at batch 1, drop per doubling of the batch)} for the
    methods available (a DFlash entry only where a drafter is shipped); `draft_fraction`:
    {method: drafting cost as a share of a verification pass}; `served_factor`: see
    `served_factors` (a method without one keeps its prediction); `served_factor_loaded`:
    the same at LOADED_BATCH (default: `served_factor`); `ks`: the draft lengths to
    consider (default: every k the profile timed)."""
    draft_fraction, served_factor = draft_fraction or {}, served_factor or {}
    loaded_factor = served_factor if served_factor_loaded is None else served_factor_loaded
    rows: list[dict[str, Any]] = []
    for dtype, costs in profile["dtypes"].items():
        prefill = NOMINAL_PROMPT * float(costs["prefill_ms_per_token"])
        decode = _step(profile, dtype, 1, 1)
        rows.append(_row(dtype, None, 0, 1.0, 1.0, prefill + NOMINAL_OUTPUT * decode))
        for method, (alpha_1, drop) in acceptance.items():
            factors = {1: served_factor.get(method, 1.0)}
            factors[LOADED_BATCH] = loaded_factor.get(method, factors[1])
            for k in (k for k in ks_timed(profile, dtype, 1) if ks is None or k in ks):
                gains = []
                for batch in (1, LOADED_BATCH):
                    if str(batch) not in costs["step_ms"]:
                        continue
                    alpha = max(0.0, alpha_1 - drop * (batch.bit_length() - 1))
                    tau = geometric_tau(alpha, k)
                    frac = draft_fraction.get(method, 0.0)
                    predicted = predicted_speedup(profile, dtype, batch, k, tau, frac)
                    gains.append(factors[batch] * predicted)
                turn = prefill + NOMINAL_OUTPUT * decode / gains[0]
                rows.append(_row(dtype, method, k, gains[0], gains[-1], turn))
    plain = min((r for r in rows if r["method"] is None), key=lambda r: r["turn_ms"])
    fits = [
        r
        for r in rows
        if r["method"] is not None
        and r["speedup"] >= min_gain
        and r["speedup_loaded"] >= 1.0
        and r["turn_ms"] < plain["turn_ms"]  # faster than plain in the best plain dtype too
    ]
    best = min(fits, key=lambda r: r["turn_ms"], default=None)
    if best is None:
        top = max((r for r in rows if r["method"]), key=lambda r: r["speedup"], default=None)
        why = (
            f"no speculative method is predicted {min_gain:.2f}x faster than plain decoding "
            f"here (best: {top['method']} k={top['k']} in {top['dtype']}, "
            f"{top['speedup']:.2f}x at batch 1, {top['speedup_loaded']:.2f}x at batch "
            f"{LOADED_BATCH})"
            if top
            else "no speculative method is available"
        )
        return Choice(plain["dtype"], None, 0, 1.0, 1.0, why, rows)
    why = (
        f"{best['method']} k={best['k']} in {best['dtype']}: predicted {best['speedup']:.2f}x "
        f"plain decoding at batch 1, {best['speedup_loaded']:.2f}x at batch {LOADED_BATCH}"
    )
    return Choice(
        best["dtype"], best["method"], best["k"], best["speedup"], best["speedup_loaded"],
        why, rows,
    )  # fmt: skip


def choose_served(
    profile: Mapping[str, Any],
    acceptance: Mapping[str, tuple[float, float]],
    draft_fraction: Mapping[str, float] | None = None,
) -> Choice:
    """`choose` with the served factors measured through the server (measured_served_factors:
    at batch 1 and at LOADED_BATCH): what start-up calibration decides."""
    first, loaded = measured_served_factors()
    return choose(profile, acceptance, draft_fraction, first, served_factor_loaded=loaded)


def _row(dtype, method, k, speedup, loaded, turn_ms) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "method": method,
        "k": k,
        "speedup": round(speedup, 3),
        "speedup_loaded": round(loaded, 3),
        "turn_ms": round(turn_ms, 1),
    }

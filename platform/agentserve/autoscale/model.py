"""Latency/capacity model of one replica: engine step time and DFlash acceptance length as
functions of batch size, the speculation schedule derived from them, and their fit.

Step time follows a roofline knee: a decode step costs `base_ms` while the tokens it
verifies (batch x (1 + drafted)) stay under `knee_tokens` (memory bound), then grows by
`per_token_ms` per token (compute bound). Acceptance is geometric: each drafted token is
accepted with probability alpha(b) = alpha_1 - alpha_drop_per_doubling * log2(b), so the
mean tokens emitted per verify step is tau = (1 - alpha^(k+1)) / (1 - alpha).
Time per output token (TPOT) = step_ms / tau. A step that verifies drafted tokens costs
`speculative_step_factor` times the roofline (1.0 where the roofline was fitted from whole
engine steps; more where it comes from GEMM step costs: autoscale/calibrated_model.py); so
does a step with no draft where the drafter runs on every step (`drafter_every_step`).
Only `draft_rate` of the steps draft (prompt lookup finds no match on the rest); step time
and tau are then the means over drafting and plain steps.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from agentserve import profiles

__all__ = [
    "WHOLE_ENGINE_MACHINE",
    "LatencyModel",
    "Measurement",
    "alpha_from_tau",
    "default_step_terms",
    "drafted_for",
    "fit",
    "geometric_tau",
    "speculation_schedule",
    "whole_engine_measurements",
]

SpeculationSchedule = list[tuple[int, int, int]]
"""vLLM `speculative_config.num_speculative_tokens_per_batch_size`: inclusive batch-size
ranges (start, end, num_speculative_tokens); 0 = no drafting for that batch size."""

_ALPHA_MAX = 0.99


@dataclass(frozen=True)
class Measurement:
    """One measured operating point of the real engine.

    `step_ms` is the wall time of one engine step (one verify step under speculation);
    `tau` the mean tokens emitted per sequence per step (None when not measured: the
    record then fits step time only).
    """

    batch: int
    drafted: int
    step_ms: float
    tau: float | None = None


# the kind of machine (engine/cpu_info.py cpu_class) whose profile holds the whole-engine step
# rows (`engine_steps`) LatencyModel's step defaults are fitted from
WHOLE_ENGINE_MACHINE = "amx"
# the batch a speculative step's loaded factor is measured at (speculation.choice.LOADED_BATCH)
LOADED_FACTOR_BATCH = 4


@dataclass(frozen=True)
class LatencyModel:
    """Step time and acceptance of one replica; all times in milliseconds.

    Step defaults = the step fit of the whole-engine rows in WHOLE_ENGINE_MACHINE's profile
    (`default_step_terms`). Prefill and acceptance defaults are assumptions
    until measured: 1 ms per prompt token; alpha 0.7 at batch 1 (tau 3.2 with 7 drafted),
    falling 0.05 per doubling of the batch. `speculative_step_factor`: what a speculative
    step costs beyond its roofline (drafting, rejection sampling), 1.0 for a whole-engine fit.
    `draft_rate`: the share of steps that draft at all (alpha is per drafted token of those).
    """

    base_ms: float = field(default_factory=lambda: default_step_terms()[0])
    knee_tokens: float = field(default_factory=lambda: default_step_terms()[1])
    per_token_ms: float = field(default_factory=lambda: default_step_terms()[2])
    prefill_ms_per_token: float = 1.0
    alpha_1: float = 0.7
    alpha_drop_per_doubling: float = 0.05
    speculative_step_factor: float = 1.0
    # the same at batch >= LOADED_FACTOR_BATCH (None: the same as at batch 1), in between
    # by log2 of the batch: vLLM's fixed cost per speculative step weighs less in a batch
    speculative_step_factor_loaded: float | None = None
    # the engine's drafter runs on every step, drafting or not (DFlash, hybrid: it must see
    # every accepted token), so a step with no draft costs a speculative step too
    drafter_every_step: bool = False
    # the share of a sequence's steps that carry a draft while drafting is on: prompt lookup
    # drafts only where the context repeats (0.4-0.6 of steps through the server), a drafter
    # every step (1.0). The other steps are plain ones: one token at a plain step's cost.
    # (In a batch the mixture is taken over whole steps: every sequence drafting or none.)
    draft_rate: float = 1.0

    def step_ms(self, batch: int, drafted: int = 0) -> float:
        """A decode step of `batch` sequences drafting `drafted` tokens where they draft
        (`draft_rate` of the steps; the mean over drafting and plain steps)."""
        return self._mixed(self._step_ms(batch, drafted), self._step_ms(batch, 0), drafted)

    def _mixed(self, drafting: float, plain: float, drafted: int) -> float:
        """The mean of a drafting step's figure and a plain one's over `draft_rate`."""
        if drafted <= 0 or self.draft_rate >= 1.0:
            return drafting
        rate = max(0.0, self.draft_rate)
        return rate * drafting + (1.0 - rate) * plain

    def _step_ms(self, batch: int, drafted: int) -> float:
        """One decode step of `batch` sequences each verifying 1 + `drafted` tokens."""
        tokens = batch * (1 + drafted)
        roofline = self.base_ms + self.per_token_ms * max(0.0, tokens - self.knee_tokens)
        speculative = drafted > 0 or self.drafter_every_step
        return roofline * (self.step_factor(batch) if speculative else 1.0)

    def step_factor(self, batch: int) -> float:
        """What a speculative step of `batch` sequences costs beyond its roofline."""
        first, loaded = self.speculative_step_factor, self.speculative_step_factor_loaded
        if loaded is None:
            return first
        weight = min(1.0, math.log2(max(1, batch)) / math.log2(LOADED_FACTOR_BATCH))
        return first + (loaded - first) * weight

    def prefill_ms(self, prompt_tokens: float) -> float:
        """Extra step time to prefill `prompt_tokens` (chunked into the running step)."""
        return self.prefill_ms_per_token * prompt_tokens

    def alpha(self, batch: int) -> float:
        """Per-token acceptance probability at this batch size, in [0, 0.99]."""
        a = self.alpha_1 - self.alpha_drop_per_doubling * math.log2(max(1, batch))
        return min(_ALPHA_MAX, max(0.0, a))

    def tau(self, batch: int, drafted: int) -> float:
        """Mean tokens emitted per sequence per step (1.0 without drafting), over drafting
        and plain steps (`draft_rate`)."""
        return self._mixed(geometric_tau(self.alpha(batch), drafted), 1.0, drafted)

    def tpot_ms(self, batch: int, drafted: int = 0) -> float:
        """Time per output token of every sequence in a batch of `batch`."""
        return self.step_ms(batch, drafted) / self.tau(batch, drafted)

    def best_drafted(self, batch: int, max_drafted: int, min_gain: float = 0.05) -> int:
        """Drafted tokens minimising TPOT at `batch`; 0 unless it beats no drafting by
        at least `min_gain` (a fraction)."""
        plain = self.tpot_ms(batch, 0)
        best_k, best = 0, plain
        for k in range(1, max_drafted + 1):
            t = self.tpot_ms(batch, k)
            if t < best:
                best_k, best = k, t
        return best_k if best <= plain * (1.0 - min_gain) else 0

    def tokens_per_s(self, batch: int, drafted: int = 0) -> float:
        """Decode throughput of one replica running `batch` sequences: batch x tau tokens
        per step. At max_num_seqs this is the replica's capacity when saturated."""
        return 1000.0 * batch / self.tpot_ms(batch, drafted)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> LatencyModel:
        """From `to_json`'s text, or `agentserve bench fit-latency --out`'s (its
        "latency_model" section). ValueError for anything else: not an object, no fields,
        a field LatencyModel does not have."""
        data = json.loads(text)
        if isinstance(data, dict) and isinstance(data.get("latency_model"), dict):
            data = data["latency_model"]  # fit-latency's figures file
        if not isinstance(data, dict) or not data:
            raise ValueError("a latency model is a JSON object of LatencyModel fields")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown latency model fields {unknown}; known: {sorted(known)}")
        wrong = sorted(k for k, v in data.items() if not isinstance(v, (int, float, type(None))))
        if wrong:
            raise ValueError(f"latency model fields {wrong} must be numbers")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> LatencyModel:
        """`from_json` of a file; ValueError naming the file when it is not one."""
        try:
            return cls.from_json(Path(path).read_text(encoding="utf-8"))
        except (ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
            raise ValueError(f"{path}: {err}") from None


def geometric_tau(alpha: float, drafted: int) -> float:
    """Mean tokens emitted per step with `drafted` tokens each accepted with `alpha`."""
    if drafted <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(drafted + 1)
    return (1.0 - alpha ** (drafted + 1)) / (1.0 - alpha)


def alpha_from_tau(tau: float, drafted: int) -> float:
    """Invert tau(alpha) (monotone increasing) by bisection."""
    lo, hi = 0.0, _ALPHA_MAX
    for _ in range(60):
        mid = (lo + hi) / 2
        if geometric_tau(mid, drafted) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def speculation_schedule(
    model: LatencyModel, max_num_seqs: int, max_drafted: int, min_gain: float = 0.05
) -> SpeculationSchedule:
    """Per-batch drafted tokens as vLLM's `num_speculative_tokens_per_batch_size`:
    contiguous inclusive ranges covering 1..max_num_seqs, first range starting at 1."""
    if max_num_seqs < 1:
        raise ValueError("max_num_seqs must be >= 1")
    ks = [model.best_drafted(b, max_drafted, min_gain) for b in range(1, max_num_seqs + 1)]
    ranges: SpeculationSchedule = []
    for b, k in enumerate(ks, start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], b, k)
        else:
            ranges.append((b, b, k))
    return ranges


def drafted_for(schedule: Sequence[tuple[int, int, int]], batch: int) -> int:
    """Drafted tokens the schedule gives `batch` (the last range extends to any batch)."""
    for start, end, k in schedule:
        if start <= batch <= end:
            return k
    return schedule[-1][2] if schedule else 0


def _fit_step(records: Sequence[Measurement]) -> tuple[float, float, float]:
    """(base_ms, knee_tokens, per_token_ms) minimising squared error over a knee grid."""
    tokens = np.array([r.batch * (1 + r.drafted) for r in records], dtype=float)
    ms = np.array([r.step_ms for r in records], dtype=float)
    best: tuple[float, float, float, float] | None = None
    for knee in np.unique(np.concatenate([[0.0], tokens])):
        x = np.maximum(0.0, tokens - knee)
        design = np.stack([np.ones_like(x), x], axis=1)  # [N, 2]
        (base, slope), *_ = np.linalg.lstsq(design, ms, rcond=None)
        if slope < 0:
            base, slope = float(ms.mean()), 0.0
        sse = float(((base + slope * x - ms) ** 2).sum())
        if best is None or sse < best[0] - 1e-9:
            best = (sse, float(base), float(knee), float(slope))
    assert best is not None
    return best[1], best[2], best[3]


def whole_engine_measurements(machine: str = WHOLE_ENGINE_MACHINE) -> tuple[Measurement, ...]:
    """The whole-engine steps measured on `machine` (its profile's `engine_steps`); empty
    where none were."""
    rows = profiles.section(machine, "engine_steps") or ()
    return tuple(Measurement(r.batch, r.drafted, r.step_ms, r.tau) for r in rows)


@functools.cache
def default_step_terms() -> tuple[float, float, float]:
    """LatencyModel's step defaults (base_ms, knee_tokens, per_token_ms): the step fit of
    `whole_engine_measurements()`, rounded as `fit` rounds. ValueError where the profile
    has fewer than two distinct token counts."""
    records = whole_engine_measurements()
    if len({r.batch * (1 + r.drafted) for r in records}) < 2:
        raise ValueError(f"profile {WHOLE_ENGINE_MACHINE!r} has no usable engine_steps rows")
    base_ms, knee, per_token = _fit_step(records)
    return round(base_ms, 3), knee, round(per_token, 4)


def _fit_acceptance(records: Sequence[Measurement]) -> tuple[float, float] | None:
    """(alpha_1, alpha_drop_per_doubling) from records with drafting and a measured tau."""
    usable = [r for r in records if r.drafted > 0 and r.tau is not None]
    if not usable:
        return None
    logb = np.array([math.log2(r.batch) for r in usable])
    alpha = np.array([alpha_from_tau(float(r.tau), r.drafted) for r in usable])  # type: ignore[arg-type]
    if np.ptp(logb) == 0:
        return float(alpha.mean()), 0.0
    slope, intercept = np.polyfit(logb, alpha, 1)
    return float(intercept), float(max(0.0, -slope))


def fit(
    records: Iterable[Measurement], *, prefill_ms_per_token: float | None = None, base=None
) -> LatencyModel:
    """Fit a LatencyModel from measured records (at least two with distinct token counts).

    Acceptance parameters come from records with drafted > 0 and a measured tau; without
    any, they are kept from `base` (default LatencyModel()). Prefill cost is not in the
    records: pass it, or keep the base value.
    """
    records = list(records)
    if len({r.batch * (1 + r.drafted) for r in records}) < 2:
        raise ValueError("fit needs records at two or more distinct token counts")
    base = base or LatencyModel()
    base_ms, knee, per_token = _fit_step(records)
    acceptance = _fit_acceptance(records) or (base.alpha_1, base.alpha_drop_per_doubling)
    return LatencyModel(
        base_ms=round(base_ms, 3),
        knee_tokens=knee,
        per_token_ms=round(per_token, 4),
        prefill_ms_per_token=(
            base.prefill_ms_per_token if prefill_ms_per_token is None else prefill_ms_per_token
        ),
        alpha_1=round(acceptance[0], 4),
        alpha_drop_per_doubling=round(acceptance[1], 4),
    )

"""Online refit of a latency prior from the replicas' own time per output token (pure).

A GPU replica without a measured latency model starts from the roofline prior
(gpu_latency.py), which rests on assumed efficiencies. Each replica publishes the mean TPOT
of the requests its window finished and the mean engine batch over that window
(`agentserve_tpot_mean_ms`, `agentserve_batch_mean`, `agentserve_tpot_samples`; see
serve/replica_stats.py). At each decision the Ray adapter (ray_policy.py) folds every
replica report with at least MIN_SAMPLES requests into `StepRefit`: per batch bucket
(powers of two: 1, 2, 4, ...), an exponentially weighted mean of observed / predicted TPOT,
each observation clamped to [RATIO_MIN, RATIO_MAX] (one odd window, a replica prefilling a
long prompt, moves the model at most that far). `refit_model` then fits the prior's step
times at batches 1, 2, 4, ..., max_num_seqs, each times its bucket's ratio (a bucket
without observations takes the nearest observed one's), back into the LatencyModel's knee
form; with no observation it is the prior itself. The prediction compared against is
always the prior's, so the ratios do not compound. The observed TPOT includes what the
prior leaves out (prefill chunks sharing steps, speculation's gain): the ratio absorbs it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agentserve.autoscale.model import LatencyModel, Measurement, drafted_for, fit

__all__ = [
    "StepRefit",
    "bucket_of_batch",
    "predicted_tpot_ms",
    "refit_from_reports",
    "refit_model",
]

RATIO_MIN, RATIO_MAX = 0.5, 4.0  # how far one observation may move the prior
WEIGHT = 0.3  # each observation's weight in its bucket's moving mean
MIN_SAMPLES = 3  # requests with a TPOT a replica window needs before it counts
# a replica's published figures (serve/replica_stats.py -> ray_policy.encode_replica_stats)
TPOT_MEAN_KEY = "agentserve_tpot_mean_ms"
BATCH_MEAN_KEY = "agentserve_batch_mean"
SAMPLES_KEY = "agentserve_tpot_samples"


def bucket_of_batch(batch: float) -> int:
    """The power of two at or below `batch` (at least 1): the bucket its ratio is kept in."""
    return 2 ** max(0, math.floor(math.log2(max(1.0, batch))))


def predicted_tpot_ms(
    model: LatencyModel, batch: float, schedule: Iterable[tuple[int, int, int]] | None
) -> float:
    """`model`'s TPOT at `batch` (rounded, at least 1) drafting what `schedule` gives it
    (none without a schedule)."""
    b = max(1, round(batch))
    return model.tpot_ms(b, drafted_for(list(schedule), b) if schedule else 0)


@dataclass(frozen=True)
class StepRefit:
    """Per batch bucket, the moving mean of observed / predicted TPOT."""

    ratios: Mapping[int, float] = field(default_factory=dict)

    def observe(
        self, batch: float, observed_ms: float, predicted_ms: float, weight: float = WEIGHT
    ) -> StepRefit:
        """A new refit with one observation folded in (clamped to [RATIO_MIN, RATIO_MAX]);
        itself for a non-positive or non-finite figure."""
        if not (observed_ms > 0 and predicted_ms > 0 and math.isfinite(observed_ms)):
            return self
        ratio = min(RATIO_MAX, max(RATIO_MIN, observed_ms / predicted_ms))
        bucket = bucket_of_batch(batch)
        old = self.ratios.get(bucket)
        new = ratio if old is None else (1.0 - weight) * old + weight * ratio
        return StepRefit({**self.ratios, bucket: new})

    def ratio(self, batch: float) -> float:
        """The ratio for `batch`: its bucket's, else the nearest observed bucket's (by
        log2 distance, the smaller on a tie), else 1.0."""
        if not self.ratios:
            return 1.0
        bucket = bucket_of_batch(batch)
        if bucket in self.ratios:
            return self.ratios[bucket]
        nearest = min(self.ratios, key=lambda k: (abs(math.log2(k) - math.log2(bucket)), k))
        return self.ratios[nearest]

    def to_dict(self) -> dict[str, float]:
        """JSON-able (policy_state): bucket as a string key."""
        return {str(k): v for k, v in sorted(self.ratios.items())}

    @classmethod
    def from_dict(cls, data: Mapping[str, float] | None) -> StepRefit:
        return cls({int(k): float(v) for k, v in (data or {}).items()})


def refit_model(prior: LatencyModel, refit: StepRefit, max_num_seqs: int) -> LatencyModel:
    """`prior` with its step terms refitted through its plain step times at batches 1, 2,
    4, ..., max_num_seqs times each bucket's ratio; `prior` itself without observations.
    Prefill and acceptance are the prior's."""
    if not refit.ratios:
        return prior
    top = max(2, max_num_seqs)
    batches = sorted({*(2**i for i in range(int(math.log2(top)) + 1)), top})
    records = [Measurement(b, 0, prior.step_ms(b) * refit.ratio(b)) for b in batches]
    fitted = fit(records, base=prior)
    return dataclasses.replace(
        prior,
        base_ms=fitted.base_ms,
        knee_tokens=fitted.knee_tokens,
        per_token_ms=fitted.per_token_ms,
    )


def refit_from_reports(
    refit: StepRefit,
    reports: Iterable[Mapping[str, float]],
    prior: LatencyModel,
    schedule: Iterable[tuple[int, int, int]] | None = None,
) -> StepRefit:
    """`refit` with each replica report (its latest published stats) of at least
    MIN_SAMPLES TPOT samples observed: its mean TPOT against the prior's at its mean batch.
    A report seen again at the next decision counts again: the moving mean then leans to
    the windows that last longest, never past the clamp."""
    schedule = None if schedule is None else list(schedule)
    for report in reports:
        if report.get(SAMPLES_KEY, 0.0) < MIN_SAMPLES:
            continue
        if TPOT_MEAN_KEY not in report or BATCH_MEAN_KEY not in report:
            continue
        batch = max(1.0, report[BATCH_MEAN_KEY])
        predicted = predicted_tpot_ms(prior, batch, schedule)
        refit = refit.observe(batch, report[TPOT_MEAN_KEY], predicted)
    return refit

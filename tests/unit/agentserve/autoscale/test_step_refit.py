"""Online refit of the latency prior from the replicas' own TPOT."""

from __future__ import annotations

import pytest
from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.step_refit import (
    BATCH_MEAN_KEY,
    RATIO_MAX,
    RATIO_MIN,
    SAMPLES_KEY,
    TPOT_MEAN_KEY,
    StepRefit,
    bucket_of_batch,
    predicted_tpot_ms,
    refit_from_reports,
    refit_model,
)

PRIOR = LatencyModel(base_ms=10.0, knee_tokens=0.0, per_token_ms=0.1, alpha_1=0.0)


@pytest.mark.parametrize("batch, bucket", [(0, 1), (1, 1), (1.9, 1), (2, 2), (3.5, 2), (8, 8)])
def test_buckets_are_powers_of_two(batch, bucket):
    assert bucket_of_batch(batch) == bucket


def test_refit_moves_toward_observations():
    refit = StepRefit()
    for _ in range(20):
        refit = refit.observe(4, observed_ms=15.0, predicted_ms=10.0)
    assert refit.ratio(4) == pytest.approx(1.5, abs=1e-3)
    once = StepRefit({4: 1.0}).observe(4, 15.0, 10.0)
    assert once.ratio(4) == pytest.approx(0.7 * 1.0 + 0.3 * 1.5)  # weight 0.3


@pytest.mark.parametrize("observed, bound", [(100.0, RATIO_MAX), (1.0, RATIO_MIN)])
def test_each_observation_is_clamped(observed, bound):
    assert StepRefit().observe(1, observed, 10.0).ratio(1) == bound


@pytest.mark.parametrize("observed", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_figure_changes_nothing(observed):
    assert StepRefit({1: 1.2}).observe(1, observed, 10.0).ratios == {1: 1.2}


def test_unobserved_buckets_take_the_nearest_observed():
    refit = StepRefit({1: 2.0, 16: 0.8})
    assert (refit.ratio(2), refit.ratio(8), refit.ratio(64)) == (2.0, 0.8, 0.8)
    assert refit.ratio(4) == 2.0  # a tie (2 doublings each way): the smaller bucket
    assert StepRefit().ratio(4) == 1.0


def test_round_trip_through_policy_state():
    refit = StepRefit({1: 1.5, 8: 0.9})
    assert StepRefit.from_dict(refit.to_dict()) == refit
    assert StepRefit.from_dict(None) == StepRefit()


def test_refit_model_scales_the_prior_steps():
    assert refit_model(PRIOR, StepRefit(), 32) is PRIOR
    scaled = refit_model(PRIOR, StepRefit({1: 2.0}), 32)  # every bucket at 2x
    for batch in (1, 4, 32):
        assert scaled.step_ms(batch) == pytest.approx(2 * PRIOR.step_ms(batch), rel=1e-3)
    assert scaled.prefill_ms_per_token == PRIOR.prefill_ms_per_token
    uneven = refit_model(PRIOR, StepRefit({1: 1.0, 32: 2.0}), 32)
    assert uneven.step_ms(1) < 1.2 * PRIOR.step_ms(1)
    assert uneven.step_ms(32) > 1.6 * PRIOR.step_ms(32)


def _report(tpot, batch, samples=5):
    return {TPOT_MEAN_KEY: tpot, BATCH_MEAN_KEY: batch, SAMPLES_KEY: samples}


def test_refit_from_reports_skips_thin_windows():
    reports = [_report(20.0, 1.0), _report(99.0, 1.0, samples=2), {SAMPLES_KEY: 9.0}]
    refit = refit_from_reports(StepRefit(), reports, PRIOR)
    assert refit.ratio(1) == pytest.approx(20.0 / PRIOR.tpot_ms(1))
    assert refit_from_reports(StepRefit(), reports[1:], PRIOR) == StepRefit()


def test_prediction_follows_the_schedule():
    drafting = LatencyModel(base_ms=10.0, knee_tokens=0.0, per_token_ms=0.1, alpha_1=0.5)
    schedule = [(1, 2, 3), (3, 64, 0)]
    assert predicted_tpot_ms(drafting, 1, schedule) == drafting.tpot_ms(1, 3)
    assert predicted_tpot_ms(drafting, 8, schedule) == drafting.tpot_ms(8, 0)
    assert predicted_tpot_ms(drafting, 0.2, None) == drafting.tpot_ms(1, 0)

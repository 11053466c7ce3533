"""Latency model: fit from measured records, speculation schedule in vLLM's format."""

from __future__ import annotations

import itertools

import pytest
from agentserve.autoscale import model as latency
from agentserve.autoscale.model import (
    LatencyModel,
    Measurement,
    drafted_for,
    fit,
    speculation_schedule,
    whole_engine_measurements,
)


def test_defaults_are_the_fit_of_the_profiles_whole_engine_rows():
    measured = whole_engine_measurements()
    assert len(measured) >= 2
    fitted = fit(measured)
    assert fitted == LatencyModel()
    for r in measured:  # within 8% of every measured step (batch-4 no-spec: 6%)
        assert fitted.step_ms(r.batch, r.drafted) == pytest.approx(r.step_ms, rel=0.08)
    # the figures the model planned with when they were constants in code
    assert (fitted.base_ms, fitted.knee_tokens, fitted.per_token_ms) == (32.231, 4.0, 2.2367)


def test_the_step_defaults_follow_the_profile_rows(monkeypatch):
    rows = (Measurement(1, 0, 20.0), Measurement(8, 0, 20.0), Measurement(16, 0, 36.0))
    monkeypatch.setattr(latency, "whole_engine_measurements", lambda: rows)
    latency.default_step_terms.cache_clear()
    try:
        got = LatencyModel()
        assert (got.base_ms, got.knee_tokens, got.per_token_ms) == (20.0, 8.0, 2.0)
        monkeypatch.setattr(latency, "whole_engine_measurements", lambda: rows[:1])
        latency.default_step_terms.cache_clear()
        with pytest.raises(ValueError, match="engine_steps"):
            LatencyModel()
    finally:
        monkeypatch.undo()
        latency.default_step_terms.cache_clear()


def test_a_machine_without_whole_engine_rows_has_none():
    assert whole_engine_measurements("a-kind-never-measured") == ()


def test_fit_recovers_a_known_model():
    truth = LatencyModel(
        base_ms=20.0, knee_tokens=8.0, per_token_ms=1.5, alpha_1=0.8, alpha_drop_per_doubling=0.1
    )
    records = [
        Measurement(b, k, truth.step_ms(b, k), truth.tau(b, k))
        for b in (1, 2, 4, 8)
        for k in (0, 3, 7)
    ]
    got = fit(records, prefill_ms_per_token=0.5)
    assert got.base_ms == pytest.approx(20.0, abs=1e-3)
    assert got.knee_tokens == 8.0 and got.per_token_ms == pytest.approx(1.5, abs=1e-3)
    assert got.alpha_1 == pytest.approx(0.8, abs=1e-3)
    assert got.alpha_drop_per_doubling == pytest.approx(0.1, abs=1e-3)
    assert got.prefill_ms_per_token == 0.5
    with pytest.raises(ValueError):
        fit([Measurement(1, 0, 30.0)])


def test_json_roundtrip(tmp_path):
    m = LatencyModel(alpha_1=0.6)
    (tmp_path / "m.json").write_text(m.to_json())
    assert LatencyModel.load(tmp_path / "m.json") == m


@pytest.mark.parametrize(
    ("model", "max_num_seqs", "max_drafted", "expected"),
    [
        (LatencyModel(), 8, 7, [(1, 1, 4), (2, 2, 3), (3, 4, 2), (5, 8, 1)]),
        (LatencyModel(), 16, 15, [(1, 1, 4), (2, 2, 3), (3, 4, 2), (5, 9, 1), (10, 16, 0)]),
        (LatencyModel(), 4, 0, [(1, 4, 0)]),
        (LatencyModel(alpha_1=0.0), 8, 7, [(1, 8, 0)]),  # nothing accepted: never draft
        (
            LatencyModel(alpha_1=0.7, alpha_drop_per_doubling=0.3),
            8,
            7,
            [(1, 1, 4), (2, 3, 1), (4, 8, 0)],
        ),
    ],
)
def test_speculation_schedule(model, max_num_seqs, max_drafted, expected):
    schedule = speculation_schedule(model, max_num_seqs, max_drafted)
    assert schedule == expected
    assert schedule[0][0] == 1 and schedule[-1][1] == max_num_seqs  # vLLM's contract
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(schedule))


def test_schedule_only_drafts_where_it_pays():
    m = LatencyModel()
    for start, end, k in speculation_schedule(m, 16, 15):
        for b in range(start, end + 1):
            assert m.tpot_ms(b, k) <= m.tpot_ms(b, 0)
    assert drafted_for([(1, 2, 5), (3, 4, 0)], 2) == 5
    assert drafted_for([(1, 2, 5), (3, 4, 0)], 9) == 0


def test_a_drafter_that_runs_every_step_makes_an_undrafted_step_cost_a_speculative_one():
    # DFlash and hybrid engines run their drafter on every step: measured, a DFlash engine
    # whose schedule drafted nothing at batch >= 4 was slower (0.88x plain) than one that
    # drafted 3 there (0.96x), so no draft must not be priced as a plain step
    shared = {"speculative_step_factor": 1.5, "alpha_1": 0.45, "alpha_drop_per_doubling": 0.0}
    plain_priced = LatencyModel(**shared)
    every_step = LatencyModel(**shared, drafter_every_step=True)
    assert plain_priced.step_ms(4, 0) == LatencyModel().step_ms(4, 0)
    assert every_step.step_ms(4, 0) == pytest.approx(1.5 * plain_priced.step_ms(4, 0))
    assert every_step.step_ms(4, 3) == plain_priced.step_ms(4, 3)
    # priced as plain, k=0 wins from batch 2; with the drafter's cost, drafting pays until
    # the verified tokens make the step compute bound
    assert speculation_schedule(plain_priced, 8, 3) == [(1, 1, 3), (2, 8, 0)]
    assert speculation_schedule(every_step, 8, 3) == [(1, 1, 3), (2, 2, 2), (3, 6, 1), (7, 8, 0)]


def test_a_method_that_drafts_on_some_steps_is_priced_as_the_mix():
    """Prompt lookup drafts only where the context repeats (about half the steps, measured
    through the server): tau and step time are the means over drafting and plain steps, so
    TPOT is no longer that of a replica drafting on every step."""
    every = LatencyModel(alpha_1=0.8, alpha_drop_per_doubling=0.0)
    half = LatencyModel(alpha_1=0.8, alpha_drop_per_doubling=0.0, draft_rate=0.5)
    for batch, k in ((1, 4), (4, 2)):
        assert half.tau(batch, k) == pytest.approx(0.5 * every.tau(batch, k) + 0.5)
        mix = 0.5 * every.step_ms(batch, k) + 0.5 * every.step_ms(batch, 0)
        assert half.step_ms(batch, k) == pytest.approx(mix)
        assert half.tpot_ms(batch, 0) == every.tpot_ms(batch, 0)  # plain is plain
        assert every.tpot_ms(batch, k) < half.tpot_ms(batch, k) < every.tpot_ms(batch, 0)
    # drafting pays where a drafting step beats plain per token, whatever the rate; the
    # rate only dilutes the gain, so a marginal gain falls under the schedule's threshold
    rare = LatencyModel(alpha_1=0.8, alpha_drop_per_doubling=0.0, draft_rate=0.05)

    def last_drafting(model):
        return max(b for b in range(1, 9) if drafted_for(speculation_schedule(model, 8, 4), b))

    assert last_drafting(rare) < last_drafting(half) <= last_drafting(every)

"""The speculation schedule and the capacity model use each method's acceptance as measured
through the server (speculation.schedule.method_acceptance: the pooled profile), not one assumed
acceptance for all: the profile follows the committed served figures, and a method's
schedule follows its profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentserve.autoscale.model import LatencyModel, alpha_from_tau
from agentserve.spec import DeploymentSpec
from agentserve.speculation.schedule import latency_model_for, method_acceptance, method_draft_rate
from agentserve_bench.served_fits import acceptance_from_served, draft_rate_from_served
from agentserve_bench.served_rows import rows_of_shipped_drafter

FIGURES = Path(__file__).resolve().parents[4] / "docs" / "benchmarks" / "speculative.json"


def _rec(method, k, c, tau, workload="coding"):
    return {"path": "served", "server": "agentserve", "method": method, "workload": workload,
            "num_speculative_tokens": k, "concurrency": c, "tau": tau}  # fmt: skip


def test_acceptance_is_inverted_from_tau_and_its_drop_fitted_over_batch():
    records = [
        _rec("ngram", 4, 1, 3.0), _rec("ngram", 4, 1, 3.0, "agent"), _rec("ngram", 4, 4, 2.5),
        _rec("dflash", 3, 1, 1.5), _rec("none", 0, 1, 1.0),
        {**_rec("ngram", 4, 1, 9.0), "server": "vllm_serve"},  # not agentserve: ignored
    ]  # fmt: skip
    got = acceptance_from_served(records)
    assert set(got) == {"ngram", "dflash"}
    a1, drop = got["ngram"]
    assert LatencyModel(alpha_1=a1).tau(1, 4) == pytest.approx(3.0, abs=0.01)
    assert LatencyModel(alpha_1=a1 - 2 * drop).tau(1, 4) == pytest.approx(2.5, abs=0.01)
    assert got["dflash"][1] == 0.0  # measured at one concurrency only


def test_rows_drafting_at_every_batch_replace_the_scheduled_ones():
    """A method measured with the schedule off is fitted from those rows only: under the
    schedule it may have drafted fewer tokens than its k (or none), which the record's tau
    does not say."""
    off = "all-gomp/schedule-off"
    records = [
        {**_rec("dflash", 3, 1, 1.2), "settings": "all-gomp"},  # scheduled: ignored
        {**_rec("dflash", 3, 1, 1.8), "settings": off},
        {**_rec("dflash", 3, 4, 1.8, "agent"), "settings": off},
        {**_rec("ngram", 4, 1, 3.0), "settings": "all-gomp"},  # no off rows: kept
    ]  # fmt: skip
    got = acceptance_from_served(records)
    assert LatencyModel(alpha_1=got["dflash"][0]).tau(1, 3) == pytest.approx(1.8, abs=0.01)
    assert got["dflash"][1] == 0.0
    assert LatencyModel(alpha_1=got["ngram"][0]).tau(1, 4) == pytest.approx(3.0, abs=0.01)


def test_a_row_counts_at_the_k_its_recorded_schedule_drafted():
    """Rows record their schedule: at concurrency 1 the row drafted the schedule's k for
    batch 1 (here 6 of a configured 8); at concurrency 4 a mix of batch sizes, so only
    schedule-off rows give the drop. Prompt lookup's tau at a fixed k is the same at any
    batch (measured: 5.07 at c=1 and c=4), so its fitted drop is 0, however low the tau
    of a c=4 row under a schedule that drafted 2 there."""
    schedule = [[1, 1, 6], [2, 3, 4], [4, 8, 2]]
    records = [
        {**_rec("ngram", 8, 1, 4.0), "settings": "s", "schedule": schedule},
        {**_rec("ngram", 8, 4, 2.6), "settings": "s", "schedule": schedule},  # no single k
        {**_rec("ngram", 8, 1, 5.0), "settings": "s/schedule-off"},
        {**_rec("ngram", 8, 4, 5.0), "settings": "s/schedule-off"},
        {**_rec("ngram", 8, 1, 9.0), "settings": "s"},  # no schedule recorded: ignored
    ]  # fmt: skip
    a1, drop = acceptance_from_served(records)["ngram"]
    want = (alpha_from_tau(4.0, 6) + alpha_from_tau(5.0, 8)) / 2
    assert a1 == pytest.approx(want, abs=1e-3)
    assert drop == 0.0
    # a scheduled c=1 row with a higher alpha than the fixed-k rows moves alpha_1 only:
    # the drop comes from rows that drafted one k at c=1 and c=4 alike
    higher = {**_rec("ngram", 8, 1, 7.0, "agent"), "settings": "s", "schedule": schedule}
    a1_more, drop_more = acceptance_from_served([*records, higher])["ngram"]
    assert a1_more > a1 and drop_more == 0.0
    legacy = acceptance_from_served(records[1:2] + records[4:])  # nothing says its k
    assert legacy["ngram"][1] > 0  # the artefact the recorded schedules remove


def test_table_follows_the_committed_served_figures():
    records = rows_of_shipped_drafter(json.loads(FIGURES.read_text()))
    assert acceptance_from_served(records) == method_acceptance(), (
        "rerun `agentserve bench speculative-served --report-only` (profiles/pooled.json)"
    )


@pytest.mark.parametrize("method", sorted(method_acceptance()))
def test_each_methods_latency_model_carries_its_own_acceptance(method):
    spec = DeploymentSpec.model_validate(
        {"models": [{"drafter": {"enabled": True, "method": method, "num_speculative_tokens": 3}}]}
    )
    latency = latency_model_for(spec.models[0])
    assert (latency.alpha_1, latency.alpha_drop_per_doubling) == method_acceptance()[method]


def test_draft_rate_counts_the_steps_that_carried_a_draft():
    # 10 requests, 110 tokens: 100 after the first ones; 20 drafting steps of tau 3 made 60,
    # so 40 plain steps made the rest: 20 of 60 steps drafted
    ngram = {**_rec("ngram", 8, 1, 3.0), "drafts": 20, "output_tokens": 110, "requests": 10}
    dflash = {**_rec("dflash", 3, 1, 1.5), "drafts": 60, "output_tokens": 100, "requests": 10}
    loaded = {**ngram, "concurrency": 4, "drafts": 30}  # rates are taken at concurrency 1
    plain = {**_rec("none", 0, 1, 1.0), "drafts": 0, "output_tokens": 110, "requests": 10}
    got = draft_rate_from_served([ngram, dflash, loaded, plain])
    assert got == {"dflash": 1.0, "ngram": pytest.approx(1 / 3, abs=1e-3)}


def test_draft_rate_table_follows_the_committed_served_figures():
    records = rows_of_shipped_drafter(json.loads(FIGURES.read_text()))
    assert draft_rate_from_served(records) == method_draft_rate(), (
        "rerun `agentserve bench speculative-served --report-only` (profiles/pooled.json)"
    )
    assert 0.3 < method_draft_rate()["ngram"] < 0.8  # prompt lookup: where the context repeats


@pytest.mark.parametrize("method", sorted(method_draft_rate()))
def test_each_methods_latency_model_carries_its_draft_rate(method):
    spec = DeploymentSpec.model_validate(
        {"models": [{"drafter": {"enabled": True, "method": method, "num_speculative_tokens": 3}}]}
    )
    assert latency_model_for(spec.models[0]).draft_rate == method_draft_rate()[method]

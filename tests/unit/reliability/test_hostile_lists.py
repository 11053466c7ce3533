"""Issue 64 items 1-2 as a load (tests/reliability/hostile_lists.py): a tenant sending the
largest lists and grammars a body holds gets a 400 for each, and the other tenant's
streams all complete."""

from __future__ import annotations

from tests.reliability.hostile_lists import HOSTILE_BODIES, hostile_lists


def test_every_hostile_list_is_refused_and_the_other_tenants_streams_complete():
    outcome = hostile_lists(rounds=1, per_round=2)
    assert outcome.clean, outcome
    hostile = outcome.details["hostile_statuses"]
    assert set(hostile) == set(HOSTILE_BODIES)
    assert all(set(by) == {"400"} for by in hostile.values()), hostile
    assert outcome.details["good_statuses"] == {"200": 2}  # attacked
    assert outcome.details["good_statuses_quiet"] == {"200": 2}
    assert outcome.details["attack_tpot_median_ms"] is not None
    assert outcome.details["no_attack_tpot_median_ms"] is not None

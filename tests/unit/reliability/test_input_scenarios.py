"""Issue 64 items 2, 3, 5 as loads (tests/reliability/): structured-output constraints,
slow bodies and poison requests from one tenant while another streams. Short runs (one
round): the statuses and the bounds, not the TPOT figure (docs/reliability.md has it)."""

from __future__ import annotations

from tests.reliability.poison_accounting import POISON_BODIES, poison_accounting
from tests.reliability.slow_bodies import slow_bodies
from tests.reliability.structured_outputs import EXPECTED, structured_outputs_grammar


def test_oversized_constraints_get_400_and_within_limit_ones_200():
    outcome = structured_outputs_grammar(rounds=1, per_round=2)
    assert outcome.clean, outcome
    hostile = outcome.details["hostile_statuses"]
    assert {name: set(by) for name, by in hostile.items()} == {
        name: {status} for name, status in EXPECTED.items()
    }
    assert outcome.details["good_statuses"] == {"200": 2}


def test_slow_bodies_get_408_or_429_and_the_control_loses_the_other_tenants_streams():
    outcome = slow_bodies(rounds=1, per_round=2)
    assert outcome.clean, outcome
    attacker = outcome.details["attacker_statuses"]["slow_body"]
    assert attacker.get("408", 0) > 0 and attacker.get("429", 0) > 0, attacker
    assert outcome.details["good_statuses"] == {"200": 2}
    control = outcome.details["control_without_limits"]
    assert control["good_lost"] > 0 and "503" in control["good_statuses"], control


def test_poison_requests_are_refused_within_their_death_budget():
    outcome = poison_accounting(rounds=1, per_round=2)
    assert outcome.clean, outcome
    hostile = outcome.details["hostile_statuses"]
    assert {name: set(by) for name, by in hostile.items()} == {n: {"400"} for n in POISON_BODIES}
    assert 0 < outcome.details["replica_deaths"] <= outcome.details["replica_deaths_bound"]
    assert outcome.details["good_statuses"] == {"200": 2}

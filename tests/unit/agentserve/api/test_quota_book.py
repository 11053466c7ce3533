"""QuotaBook: one set of tenant limits for several ingress replicas, and the leases of an
ingress that went silent finished by the book."""

from __future__ import annotations

import pytest
from agentserve.admission.quota_book import (
    LEASE_TTL_S,
    QuotaBook,
    has_limits,
    refusal_error,
    share_of,
)
from agentserve.api.auth import Tenant
from agentserve.spec import RateLimitSpec, SLASpec


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _tenant(**limits) -> Tenant:
    sla = SLASpec(ttft_p95_ms=1000, tpot_p95_ms=100)
    return Tenant(name="t", sla=sla, rate_limit=RateLimitSpec(**limits))


def test_concurrency_limit_holds_across_owners():
    book, tenant = QuotaBook(Clock()), _tenant(max_concurrent_requests=3)
    answers = [book.admit(owner, tenant) for owner in ("a", "b", "a", "b")]
    assert [kind for kind, _ in answers] == ["lease", "lease", "lease", "refused"]
    err = refusal_error(answers[-1][1])
    assert err.status == 429 and err.code == "concurrency_limit_exceeded"
    book.finish("b", answers[1][1], 10)  # b's lease ends: one slot frees, for anyone
    assert book.admit("a", tenant)[0] == "lease"
    assert book.open_leases() == 3 and book.open_leases("a") == 3


def test_requests_per_minute_counted_once_for_all_owners():
    clock = Clock()
    book, tenant = QuotaBook(clock), _tenant(requests_per_minute=4)
    kinds = []
    for i in range(6):
        kind, lease = book.admit("ab"[i % 2], tenant)
        kinds.append(kind)
        if kind == "lease":
            book.finish("ab"[i % 2], lease, 1)
    assert kinds == ["lease"] * 4 + ["refused"] * 2
    clock.now = 61.0  # the window moved on
    assert book.admit("a", tenant)[0] == "lease"


def test_a_silent_owners_leases_are_finished_charging_their_reservation():
    clock = Clock()
    book = QuotaBook(clock)
    tenant = _tenant(max_concurrent_requests=2, tokens_per_minute=1000)
    _, dead = book.admit("dead", tenant, reserve_tokens=300)
    book.admit("alive", tenant, reserve_tokens=300)
    assert book.admit("alive", tenant)[0] == "refused"  # 2 in flight
    clock.now = LEASE_TTL_S / 2
    book.renew("alive")
    assert book.open_leases() == 2 and book.expired == 0  # not silent long enough yet
    clock.now = LEASE_TTL_S + 1  # "dead" has not called since 0, "alive" renewed at TTL/2
    book.renew("alive")
    assert book.open_leases("dead") == 0 and book.open_leases("alive") == 1
    assert book.expired == 1
    # the dead lease's 300 reserved tokens were charged: 300 + 300 reserved + 500 > 1000
    kind, refusal = book.admit("alive", tenant, reserve_tokens=500)
    assert kind == "refused" and refusal_error(refusal).code == "tokens_limit_exceeded"
    book.finish("dead", dead, 5)  # a late finish of an expired lease changes nothing
    assert book.open_leases() == 1


def test_share_of_splits_each_limit_rounding_up():
    tenant = _tenant(requests_per_minute=5, max_concurrent_requests=1)
    half = share_of(tenant, 2)
    assert half.rate_limit.requests_per_minute == 3
    assert half.rate_limit.max_concurrent_requests == 1
    assert half.rate_limit.tokens_per_minute is None
    assert share_of(tenant, 1) is tenant
    assert has_limits(tenant) and not has_limits(_tenant())


@pytest.mark.parametrize("limits", [{}, {"requests_per_minute": 1}])
def test_refusal_error_round_trips(limits):
    book, tenant = QuotaBook(Clock()), _tenant(max_concurrent_requests=1, **limits)
    book.admit("a", tenant)
    kind, refusal = book.admit("a", tenant)
    assert kind == "refused"
    err = refusal_error(refusal)
    assert err.headers()["Retry-After"] and "in flight" in err.message


def test_a_request_over_the_whole_token_budget_comes_back_as_a_400_naming_max_tokens():
    book, tenant = QuotaBook(Clock()), _tenant(tokens_per_minute=100)
    kind, refusal = book.admit("a", tenant, reserve_tokens=101)
    assert kind == "refused"
    err = refusal_error(refusal)
    assert (err.status, err.param, err.code) == (400, "max_tokens", "tokens_limit_exceeded")


def test_a_lease_older_than_the_longest_request_is_finished_though_its_owner_lives():
    clock = Clock()
    book = QuotaBook(clock, max_age_s=100)
    tenant = _tenant(max_concurrent_requests=1)
    assert book.admit("a", tenant)[0] == "lease"  # its answer never reached the ingress
    for t in (30, 60, 90):
        clock.now = t
        book.renew("a")  # the owner keeps renewing
        assert book.admit("a", tenant)[0] == "refused"
    clock.now = 101
    book.renew("a")
    assert book.open_leases() == 0 and book.expired == 1
    assert book.admit("a", tenant)[0] == "lease"


def test_a_lease_finished_before_its_admission_arrives_is_never_opened():
    clock = Clock()
    book, tenant = QuotaBook(clock, max_age_s=100), _tenant(max_concurrent_requests=1)
    book.finish("a", "a/7", 0)  # the owner gave up on its admit call and withdrew it
    assert book.admit("a", tenant, lease_id="a/7") == ("withdrawn", "a/7")
    assert book.open_leases() == 0
    assert book.admit("a", tenant, lease_id="a/8") == ("lease", "a/8")  # the slot is free
    book.finish("a", "a/8", 0)
    book.finish("a", "a/9", 0)
    clock.now = 101
    book.renew("a")  # a withdrawal is forgotten once no admission can be that late
    assert book.admit("a", tenant, lease_id="a/9") == ("lease", "a/9")


def test_n_choices_hold_n_concurrency_places_and_n_over_the_limit_is_a_400():
    book, tenant = QuotaBook(Clock()), _tenant(max_concurrent_requests=4)
    kind, lease = book.admit("a", tenant, 0, "l1", count=3)  # n=3: three engine sequences
    assert kind == "lease"
    refused = book.admit("b", tenant, 0, "l2", count=2)
    assert refused[0] == "refused" and refusal_error(refused[1]).status == 429
    never = book.admit("b", tenant, 0, "l3", count=5)
    err = refusal_error(never[1])
    assert err.status == 400 and err.param == "n", "n=5 can never fit a limit of 4"
    book.finish("a", lease, 10)
    assert book.admit("b", tenant, 0, "l4", count=4)[0] == "lease"


def test_finish_is_idempotent_and_a_restarted_book_adopts_open_leases():
    clock = Clock()
    book, tenant = QuotaBook(clock), _tenant(max_concurrent_requests=2, tokens_per_minute=100)
    _, lease = book.admit("a", tenant, 30, "a/1")
    book.finish("a", lease, 20)
    book.finish("a", lease, 20)  # a retried finish charges once
    assert book.admit("a", tenant, 80, "a/2")[0] == "lease", "20 charged, not 40"
    restarted = QuotaBook(clock)
    assert restarted.adopt("a", [("a/2", tenant, 80, 1), ("a/3", tenant, 1, 1)]) == 2
    assert restarted.adopt("a", [("a/2", tenant, 80, 1)]) == 0, "adopted once"
    kind, _ = restarted.admit("b", tenant, 1, "b/1")
    assert kind == "refused", "the adopted leases count against the limits"
    assert restarted.in_flight_elsewhere("b") == {"t": 2}

"""One tenant-limits book shared by several ingress replicas (admission/shared_limits.py hosts it).

Each ingress replica (an owner) asks the book to admit a request and later to finish its
lease; the limits are those of admission/quota.RateLimiter, kept once for all replicas, so a
tenant limited to 3 requests in flight gets 3 in all, not 3 per ingress. An ingress that
dies cannot finish its leases: every owner renews itself at least every RENEW_S
(`renew`, or any admit/finish), and the leases of an owner not heard from for LEASE_TTL_S
are finished by the book, charging their whole reservation (the tokens may have been
spent), and so is any lease older than the longest request (an answer its owner never
got). An owner may name its leases: finishing a lease the book does not hold (yet) withdraws
that name, so an admission the owner gave up on (its call timed out) and finished before it
arrived opens nothing when it does. Finishing is idempotent (a retried finish charges
once). A restarted book knows no lease: each owner's renewal lists its open leases and
the book adopts those it lacks (`adopt`), so the limits count them again at once, and
an owner it never heard of sends its window of the last minute (`restore`). Pure:
the clock is injected, there is no Ray here.

Answers are plain data (they cross a Ray call): `admit` returns ("lease", lease id) or
("refused", (message, retry_after_s, code, param)); `refusal_error` turns the latter back into
the RateLimitError the ingress raises.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable

from agentserve.admission.quota import Lease, RateLimiter
from agentserve.api.auth import Tenant
from agentserve.api.errors import APIError, InvalidRequestError, RateLimitError

__all__ = [
    "LEASE_TTL_S",
    "RENEW_S",
    "Admission",
    "OpenLease",
    "QuotaBook",
    "has_limits",
    "refusal_error",
    "share_of",
]

RENEW_S = 2.0  # an ingress renews its leases at least this often
LEASE_TTL_S = 10.0  # leases of an owner silent this long are finished by the book
DEFAULT_MAX_AGE_S = 360.0  # server.request_timeout_s' default (300 s) and a margin

# ("lease", id) | ("refused", (message, retry_after_s, code, param)) | ("withdrawn", id)
Admission = tuple[str, object]
# an owner's open lease as it reports it: (lease id, tenant, reserved tokens, count)
OpenLease = tuple[str, Tenant, int, int]


def has_limits(tenant: Tenant) -> bool:
    """Whether any of the tenant's limits is set (unlimited tenants need no shared book)."""
    limits = tenant.rate_limit
    return bool(
        limits.requests_per_minute or limits.tokens_per_minute or limits.max_concurrent_requests
    )


def share_of(tenant: Tenant, replicas: int) -> Tenant:
    """The tenant with each limit split over `replicas` ingress replicas (rounded up): the
    limits an ingress applies alone while the shared book cannot be reached."""
    if replicas <= 1:
        return tenant
    limits = tenant.rate_limit.model_dump()
    split = {k: None if v is None else math.ceil(v / replicas) for k, v in limits.items()}
    return dataclasses.replace(tenant, rate_limit=tenant.rate_limit.model_copy(update=split))


def refusal_error(refusal: object) -> APIError:
    """The RateLimitError (429) of a refusal; InvalidRequestError (400) for a request
    that can never fit (n over max_concurrent_requests, a reservation over
    tokens_per_minute: no retry_after_s)."""
    message, retry_after_s, code, param = refusal  # type: ignore[misc]
    if retry_after_s is None:
        return InvalidRequestError(message, param=param, code=code)
    return RateLimitError(message, retry_after_s=retry_after_s, code=code)


class QuotaBook:
    """Leases of many owners (ingress replicas) against one RateLimiter."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = LEASE_TTL_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
    ):
        """`max_age_s`: a lease older than this is finished by the book even if its
        owner is alive (an answer its owner never received, e.g. a call that timed out:
        no request lives longer than server.request_timeout_s)."""
        self._clock, self._ttl_s, self._max_age_s = clock, ttl_s, max_age_s
        self.limiter = RateLimiter(clock)
        self._leases: dict[str, tuple[str, Lease]] = {}  # lease id -> (owner, lease)
        self._opened: dict[str, float] = {}  # lease id -> when it was admitted
        self._heard: dict[str, float] = {}  # owner -> last time it called
        self._withdrawn: dict[str, float] = {}  # lease id finished before admitted -> when
        self._ids = itertools.count()
        self.expired = 0  # leases finished for owners that went silent

    def admit(
        self,
        owner: str,
        tenant: Tenant,
        reserve_tokens: int = 0,
        lease_id: str | None = None,
        count: int = 1,
    ) -> Admission:
        """("lease", id) or ("refused", ...); ("withdrawn", id) when `lease_id` was finished
        before this admission arrived."""
        self.renew(owner)
        if lease_id is not None and self._withdrawn.pop(lease_id, None) is not None:
            return "withdrawn", lease_id
        try:
            lease = self.limiter.admit(tenant, reserve_tokens, count)
        except APIError as err:  # RateLimitError, or n over max_concurrent_requests (400)
            retry_after_s = getattr(err, "retry_after_s", None)  # None: a 400, never fits
            return "refused", (err.message, retry_after_s, err.code, err.param)
        lease_id = lease_id or f"{owner}/{next(self._ids)}"
        self._leases[lease_id] = (owner, lease)
        self._opened[lease_id] = self._clock()
        return "lease", lease_id

    def finish(self, owner: str, lease_id: str, tokens: int) -> None:
        """Finish one lease, charging `tokens`. An unknown lease (expired, or not admitted
        yet) is withdrawn: an admission under its id that arrives later opens nothing."""
        self.renew(owner)
        entry = self._leases.pop(lease_id, None)
        self._opened.pop(lease_id, None)
        if entry is not None:
            entry[1].finish(tokens)
        else:
            self._withdrawn[lease_id] = self._clock()

    def adopt(self, owner: str, leases: list[OpenLease], count_requests: bool = True) -> int:
        """Count `owner`'s open leases the book does not hold (it restarted, or expired
        them while the owner was unreachable), without checking limits; how many.
        `count_requests` False: their requests_per_minute entries come by `restore`."""
        self.renew(owner)
        adopted = 0
        for lease_id, tenant, reserved, count in leases:
            if lease_id in self._leases or lease_id in self._withdrawn:
                continue
            lease = self.limiter.adopt(tenant, reserved, count, count_requests)
            self._leases[lease_id] = (owner, lease)
            self._opened[lease_id] = self._clock()
            adopted += 1
        return adopted

    def restore(self, history: dict[str, tuple[list[float], list[tuple[float, int]]]]) -> None:
        """Add an owner's window of requests and charged tokens (RateLimiter.history) to
        a book that restarted without it."""
        self.limiter.restore(history)

    def in_flight_elsewhere(self, owner: str) -> dict[str, int]:
        """Tenant -> requests in flight through owners other than `owner`."""
        counts: dict[str, int] = {}
        for who, lease in self._leases.values():
            if who != owner:
                counts[lease._tenant] = counts.get(lease._tenant, 0) + lease.count
        return counts

    def renew(self, owner: str) -> None:
        """`owner` is alive; finish the leases of owners silent for the TTL."""
        now = self._clock()
        self._heard[owner] = now
        silent = {o for o, at in self._heard.items() if now - at > self._ttl_s}
        too_old = now - self._max_age_s
        for lease_id, (who, lease) in list(self._leases.items()):
            if who in silent or self._opened[lease_id] < too_old:
                del self._leases[lease_id], self._opened[lease_id]
                lease.finish(lease.reserved)
                self.expired += 1
        for who in silent:
            del self._heard[who]
        for lease_id, at in list(self._withdrawn.items()):
            if at < too_old:  # no admission is that late
                del self._withdrawn[lease_id]

    def owners(self) -> list[str]:
        """The owners heard from within the TTL."""
        return sorted(self._heard)

    def open_leases(self, owner: str | None = None) -> int:
        return sum(owner is None or who == owner for who, _ in self._leases.values())

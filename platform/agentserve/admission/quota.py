"""Per-tenant rate limits (requests/min, tokens/min, concurrent requests) -> 429.

A 60 s sliding window per tenant; the clock is injected. Tokens are reserved at admission
(the request's prompt estimate + its output limit, see admission/shares.py
`token_reservation`) and settled when it ends: the reservation is released and the
actual prompt + output tokens are charged. A request whose reservation does not fit what
is left of the tenant's `tokens_per_minute` (charged tokens in the window plus the
reservations of its requests in flight) is refused, so concurrent requests cannot
overspend the budget together. A request of n choices holds n places of the tenant's
max_concurrent_requests (each is an engine sequence), and one of its requests_per_minute.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agentserve.api.auth import Tenant
from agentserve.api.errors import InvalidRequestError, RateLimitError

__all__ = ["Lease", "RateLimiter"]

WINDOW_S = 60.0
UNKNOWN_WAIT_S = 1.0  # Retry-After when only requests in flight hold the budget


@dataclass
class _Usage:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    in_flight: int = 0
    reserved: int = 0  # tokens reserved by requests in flight


class Lease:
    """An admitted request; call `finish(tokens)` exactly once when it ends."""

    def __init__(self, limiter: RateLimiter, tenant: str, reserved: int = 0, count: int = 1):
        self._limiter, self._tenant, self._open = limiter, tenant, True
        self.reserved, self.count = reserved, count

    def finish(self, tokens: int) -> None:
        """Release the concurrency slot and the reservation, charge the `tokens` actually
        used (prompt + output); later calls do nothing."""
        if self._open:
            self._open = False
            self._limiter._finish(self._tenant, tokens, self.reserved, self.count)


class RateLimiter:
    """Admits requests per tenant within its RateLimitSpec, else raises RateLimitError."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._usage: dict[str, _Usage] = {}

    def admit(self, tenant: Tenant, reserve_tokens: int = 0, count: int = 1) -> Lease:
        """Count one request of `count` choices for `tenant`, reserving `reserve_tokens` of
        its tokens_per_minute, or raise RateLimitError (429) naming the limit
        (InvalidRequestError, 400, when the request alone exceeds a limit: `count` over
        max_concurrent_requests, `reserve_tokens` over tokens_per_minute)."""
        limits, now = tenant.rate_limit, self._clock()
        usage = self._usage.setdefault(tenant.name, _Usage())
        _expire(usage, now)
        most = limits.max_concurrent_requests
        if most and count > most:
            raise InvalidRequestError(
                f"{count} choices (n, times a batch's prompts) would be {count} requests in "
                f"flight, more than tenant {tenant.name!r}'s max_concurrent_requests "
                f"({most}); send a smaller n or fewer prompts",
                param="n",
                code="concurrency_limit_exceeded",
            )
        if most and usage.in_flight + count > most:
            raise RateLimitError(
                f"tenant {tenant.name!r}: {usage.in_flight} requests in flight, limit {most}"
                + (f" (this one counts {count}: its n)" if count > 1 else ""),
                code="concurrency_limit_exceeded",
            )
        if limits.requests_per_minute and len(usage.requests) >= limits.requests_per_minute:
            raise RateLimitError(
                f"tenant {tenant.name!r}: over {limits.requests_per_minute} requests per minute",
                retry_after_s=usage.requests[0] + WINDOW_S - now,
            )
        reserve = max(1, reserve_tokens) if limits.tokens_per_minute else 0  # >= 1 token
        if limits.tokens_per_minute:
            _check_tokens(tenant.name, limits.tokens_per_minute, usage, reserve, now)
        usage.requests.append(now)
        usage.in_flight += count
        usage.reserved += reserve
        return Lease(self, tenant.name, reserve, count)

    def adopt(
        self, tenant: Tenant, reserve_tokens: int = 0, count: int = 1, count_request: bool = True
    ) -> Lease:
        """Count a request admitted elsewhere (by another book, before a restart) without
        checking any limit: it runs already. Its reservation is taken as given;
        `count_request` False: its requests_per_minute entry comes by `restore`."""
        usage = self._usage.setdefault(tenant.name, _Usage())
        _expire(usage, self._clock())
        reserve = reserve_tokens if tenant.rate_limit.tokens_per_minute else 0
        if count_request:
            usage.requests.append(self._clock())
        usage.in_flight += count
        usage.reserved += reserve
        return Lease(self, tenant.name, reserve, count)

    def history(self) -> dict[str, tuple[list[float], list[tuple[float, int]]]]:
        """Tenant -> (ages of its requests, (age, tokens) charged) in the window: what a
        restarted book needs to know of this one (`restore`)."""
        now, out = self._clock(), {}
        for name, usage in self._usage.items():
            _expire(usage, now)
            if usage.requests or usage.tokens:
                ages = [now - at for at in usage.requests]
                out[name] = (ages, [(now - at, n) for at, n in usage.tokens])
        return out

    def restore(self, history: dict[str, tuple[list[float], list[tuple[float, int]]]]) -> None:
        """Add another book's window (its `history()`), in time order with this one's."""
        now = self._clock()
        for name, (ages, charges) in history.items():
            usage = self._usage.setdefault(name, _Usage())
            usage.requests = deque(sorted([*usage.requests, *(now - a for a in ages)]))
            usage.tokens = deque(sorted([*usage.tokens, *((now - a, n) for a, n in charges)]))
            _expire(usage, now)

    def in_flight(self, tenant: str) -> int:
        usage = self._usage.get(tenant)
        return 0 if usage is None else usage.in_flight

    def _finish(self, tenant: str, tokens: int, reserved: int, count: int = 1) -> None:
        usage = self._usage[tenant]
        usage.in_flight -= count
        usage.reserved -= reserved
        if tokens > 0:
            usage.tokens.append((self._clock(), tokens))


def _check_tokens(name: str, limit: int, usage: _Usage, reserve: int, now: float) -> None:
    """RateLimitError unless charged + reserved + `reserve` tokens fit in `limit`."""
    if reserve > limit:  # can never fit: a 400, so that clients do not retry it
        raise InvalidRequestError(
            f"tenant {name!r}: this request may use up to {reserve} tokens (prompt estimate "
            f"+ max_tokens; the model's whole context when max_tokens is not sent), more "
            f"than the limit of {limit} tokens per minute; send a smaller max_tokens (or "
            "max_completion_tokens)",
            param="max_tokens",
            code="tokens_limit_exceeded",
        )
    charged = sum(n for _, n in usage.tokens)
    if charged + usage.reserved + reserve <= limit:
        return
    raise RateLimitError(
        f"tenant {name!r}: over {limit} tokens per minute ({charged} used, "
        f"{usage.reserved} reserved by requests in flight, this one needs up to {reserve})",
        retry_after_s=_retry_after(usage, limit - usage.reserved - reserve, now),
        code="tokens_limit_exceeded",
    )


def _retry_after(usage: _Usage, allowed: int, now: float) -> float:
    """Seconds until the window's charged tokens drop to `allowed` (the oldest leave
    first); UNKNOWN_WAIT_S when reservations in flight alone stand in the way."""
    charged = sum(n for _, n in usage.tokens)
    if allowed >= 0:
        for at, n in usage.tokens:
            charged -= n
            if charged <= allowed:
                return at + WINDOW_S - now
    return UNKNOWN_WAIT_S


def _expire(usage: _Usage, now: float) -> None:
    while usage.requests and usage.requests[0] <= now - WINDOW_S:
        usage.requests.popleft()
    while usage.tokens and usage.tokens[0][0] <= now - WINDOW_S:
        usage.tokens.popleft()

"""Per-tenant rate limits (requests/min, tokens/min, concurrent requests) -> 429.

A 60 s sliding window per tenant; the clock is injected. Tokens are charged when a
request finishes (prompt + output), so a tenant over its token budget is refused from
its next request on.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agentserve.api.auth import Tenant
from agentserve.api.errors import RateLimitError

__all__ = ["Lease", "RateLimiter"]

WINDOW_S = 60.0


@dataclass
class _Usage:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    in_flight: int = 0


class Lease:
    """An admitted request; call `finish(tokens)` exactly once when it ends."""

    def __init__(self, limiter: RateLimiter, tenant: str):
        self._limiter, self._tenant, self._open = limiter, tenant, True

    def finish(self, tokens: int) -> None:
        """Release the concurrency slot and charge `tokens`; later calls do nothing."""
        if self._open:
            self._open = False
            self._limiter._finish(self._tenant, tokens)


class RateLimiter:
    """Admits requests per tenant within its RateLimitSpec, else raises RateLimitError."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._usage: dict[str, _Usage] = {}

    def admit(self, tenant: Tenant) -> Lease:
        """Count one request for `tenant` or raise RateLimitError (429) naming the limit."""
        limits, now = tenant.rate_limit, self._clock()
        usage = self._usage.setdefault(tenant.name, _Usage())
        _expire(usage, now)
        if limits.max_concurrent_requests and usage.in_flight >= limits.max_concurrent_requests:
            raise RateLimitError(
                f"tenant {tenant.name!r}: {usage.in_flight} requests in flight, limit "
                f"{limits.max_concurrent_requests}",
                code="concurrency_limit_exceeded",
            )
        if limits.requests_per_minute and len(usage.requests) >= limits.requests_per_minute:
            raise RateLimitError(
                f"tenant {tenant.name!r}: over {limits.requests_per_minute} requests per minute",
                retry_after_s=usage.requests[0] + WINDOW_S - now,
            )
        used = sum(n for _, n in usage.tokens)
        if limits.tokens_per_minute and used >= limits.tokens_per_minute:
            raise RateLimitError(
                f"tenant {tenant.name!r}: over {limits.tokens_per_minute} tokens per minute",
                retry_after_s=usage.tokens[0][0] + WINDOW_S - now,
                code="tokens_limit_exceeded",
            )
        usage.requests.append(now)
        usage.in_flight += 1
        return Lease(self, tenant.name)

    def _finish(self, tenant: str, tokens: int) -> None:
        usage = self._usage[tenant]
        usage.in_flight -= 1
        if tokens > 0:
            usage.tokens.append((self._clock(), tokens))


def _expire(usage: _Usage, now: float) -> None:
    while usage.requests and usage.requests[0] <= now - WINDOW_S:
        usage.requests.popleft()
    while usage.tokens and usage.tokens[0][0] <= now - WINDOW_S:
        usage.tokens.popleft()

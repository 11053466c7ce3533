"""GET /health without a key, at a bounded cost: the answer is computed at most once per
HEALTH_TTL_S (one Serve health call per model), concurrent callers share the check in
flight, and clients sending no credentials (/health, or any request without an
Authorization header while keys are required) are rate-limited per client address.

A flood of /health therefore costs the head one Serve call per model per second, not one
per request; past UNAUTH_RATE_PER_S (burst UNAUTH_BURST) a client gets 429 with
Retry-After. Clients are told apart by the ASGI `client` host (Serve's proxy passes the
peer through); at most MAX_CLIENTS are remembered (least recently seen forgotten first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import JSONResponse

from agentserve.api.errors import RateLimitError
from agentserve.serve.backend import ModelBackend

__all__ = ["HEALTH_TTL_S", "HealthCache", "UnauthenticatedLimit"]

log = logging.getLogger("agentserve.serve.ingress")
HEALTH_TTL_S = 1.0
UNAUTH_RATE_PER_S = 20.0
UNAUTH_BURST = 40.0
MAX_CLIENTS = 4096
UNAUTH_PATHS = frozenset({"/health"})


class HealthCache:
    """The /health answer (status code, body), at most HEALTH_TTL_S old."""

    def __init__(
        self,
        backends: Mapping[str, ModelBackend],
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = HEALTH_TTL_S,
    ):
        self.backends, self.clock, self.ttl_s = dict(backends), clock, ttl_s
        self.checks = 0  # health checks made (each one Serve call per model)
        self._answer: tuple[float, int, dict[str, Any]] | None = None
        self._pending: asyncio.Future | None = None

    async def answer(self) -> tuple[int, dict[str, Any]]:
        """The cached answer while fresh; else the one check in flight, or a new one."""
        now = self.clock()
        if self._answer is not None and now - self._answer[0] < self.ttl_s:
            return self._answer[1], self._answer[2]
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._check())
        return await asyncio.shield(self._pending)

    async def _check(self) -> tuple[int, dict[str, Any]]:
        self.checks += 1
        states: dict[str, str] = {}
        for name, backend in self.backends.items():
            try:
                await backend.health()
                states[name] = "ok"
            except Exception:  # any failure means "not ready"; log it, tell no details
                log.warning("health check of model %s failed", name, exc_info=True)
                states[name] = "unavailable"
        ok = all(s == "ok" for s in states.values())
        body = {"status": "ok" if ok else "unavailable", "models": states}
        status = 200 if ok else 503
        self._answer = (self.clock(), status, body)
        return status, body


class UnauthenticatedLimit:
    """ASGI middleware: a token bucket per client host for requests without credentials
    (UNAUTH_PATHS always; others when `keys_required` and no Authorization header)."""

    def __init__(
        self,
        app: Any,
        keys_required: Callable[[], bool],
        rate_per_s: float = UNAUTH_RATE_PER_S,
        burst: float = UNAUTH_BURST,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.app, self.keys_required, self.clock = app, keys_required, clock
        self.rate_per_s, self.burst = rate_per_s, burst
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def unauthenticated(self, scope: dict[str, Any]) -> bool:
        if scope.get("path") in UNAUTH_PATHS:
            return True
        has_key = any(name == b"authorization" for name, _ in scope.get("headers") or ())
        return not has_key and self.keys_required()

    def allow(self, client: str) -> bool:
        """Take one token from `client`'s bucket; False when it is empty."""
        now = self.clock()
        tokens, at = self._buckets.pop(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[client] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)
        return allowed

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and self.unauthenticated(scope):
            client = str((scope.get("client") or ("unknown",))[0])
            if not self.allow(client):
                err = RateLimitError(
                    "Too many requests without an API key from this address; retry later.",
                    retry_after_s=1.0,
                )
                response = JSONResponse(err.body(), status_code=429, headers=err.headers())
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

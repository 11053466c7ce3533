"""One answer shared by every caller for a second: the admin endpoints (/status, /metrics)
call the Serve controller and every model per computation, so a flood of scrapes must not
multiply that work. `Cached.get()` returns the last result while it is younger than
`ttl_s`, else starts one computation that concurrent callers share (an error is not kept:
the next call computes again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["ADMIN_TTL_S", "Cached"]

ADMIN_TTL_S = 1.0
T = TypeVar("T")


class Cached(Generic[T]):
    """`compute()`'s result, at most `ttl_s` old; one computation in flight at a time."""

    def __init__(
        self,
        compute: Callable[[], Awaitable[T]],
        ttl_s: float = ADMIN_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.compute, self.ttl_s, self.clock = compute, ttl_s, clock
        self.computed = 0  # computations started
        self._value: tuple[float, T] | None = None
        self._pending: asyncio.Future[T] | None = None

    async def get(self) -> T:
        if self._value is not None and self.clock() - self._value[0] < self.ttl_s:
            return self._value[1]
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._pending)

    async def _run(self) -> T:
        self.computed += 1
        value = await self.compute()
        self._value = (self.clock(), value)
        return value

"""Idle sleep of a replica's engine: after `idle_s` without a request the engine sleeps
(vLLM sleep mode level 1 on GPU, `replicas.sleep_when_idle_s`); the next request wakes it
before it is submitted.

Contracts:
- The engine sleeps only with no request in flight, and no request reaches the engine
  while it sleeps or is falling asleep: a request arriving then waits for the wake.
- Requests arriving together share one wake (one lock serializes sleep and wake).
- `wake_s` is the last wake's duration (seconds), None before the first; `sleeping` is
  the state now. Both feed the replica's autoscaling stats (`SleepState`).
- A failed sleep leaves the engine awake (logged); a failed wake raises to the request
  that waited (the next request tries again).
The clock is injected (monotonic by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from agentserve.engine.protocol import Sleeper, can_sleep

__all__ = ["SleepGate", "SleepState", "sleep_gate"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SleepState:
    """What a replica reports: whether its engine sleeps now, and its last wake (s)."""

    sleeping: bool
    wake_s: float | None


def sleep_gate(engine: object, idle_s: float | None) -> SleepGate | None:
    """The gate for a replica: None when idle sleep is off (`idle_s` None); a TypeError
    when it is on but the engine cannot sleep (the spec allows it on GPU replicas only)."""
    if idle_s is None:
        return None
    if not can_sleep(engine):
        raise TypeError(f"{type(engine).__name__} has no sleep mode (sleep_when_idle_s)")
    return SleepGate(engine, idle_s)  # type: ignore[arg-type]


class SleepGate:
    """Wrap each request in `async with gate.serving():`; call `arm()` once started."""

    def __init__(self, engine: Sleeper, idle_s: float, clock: Callable[[], float] = time.monotonic):
        self.engine, self.idle_s, self.clock = engine, idle_s, clock
        self.sleeping = False
        self.wake_s: float | None = None
        self.sleeps = self.wakes = 0
        self._in_flight = 0
        self._idle_since = clock()
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None
        self._waking: asyncio.Task[None] | None = None

    def state(self) -> SleepState:
        return SleepState(self.sleeping, self.wake_s)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Hold the engine awake for one request (waking it first when it sleeps)."""
        self._in_flight += 1
        try:
            if self.sleeping or self._lock.locked():  # asleep, or a sleep/wake under way
                await self._wake()
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle_since = self.clock()
                self.arm()

    def arm(self) -> None:
        """Start watching for idleness (no-op when a watch already runs)."""
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._sleep_when_idle())

    def close(self) -> None:
        for task in (self._watch, self._waking):
            if task is not None:
                task.cancel()

    async def _wake(self) -> None:
        async with self._lock:
            if not self.sleeping:  # another request woke it, or the sleep was skipped
                return
            if self._waking is None or self._waking.done():
                self._waking = asyncio.get_running_loop().create_task(self._wake_up())
            # shielded: a request cancelled while waiting must not cut the wake in half
            await asyncio.shield(self._waking)

    async def _wake_up(self) -> None:
        started = self.clock()
        await self.engine.wake_up()
        self.wake_s = self.clock() - started
        self.sleeping, self.wakes = False, self.wakes + 1
        log.info("engine awake in %.2f s", self.wake_s)
        if self._in_flight == 0:  # its requests went away while it woke
            self._idle_since = self.clock()
            self.arm()

    async def _sleep_when_idle(self) -> None:
        """Wait until idle_s passed since the last request ended, then sleep (once)."""
        while not self.sleeping and self._in_flight == 0:
            left = self._idle_since + self.idle_s - self.clock()
            if left > 0:
                await asyncio.sleep(left)
                continue
            async with self._lock:  # checked and set with no await between: atomic
                if self._in_flight or self.sleeping:
                    return
                try:
                    await self.engine.sleep()
                except Exception:  # top of a background task: stay awake, log it
                    log.exception("engine sleep failed; it stays awake")
                    return
                self.sleeping, self.sleeps = True, self.sleeps + 1
                log.info("engine asleep after %.0f s idle", self.idle_s)
            return

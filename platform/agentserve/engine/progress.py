"""Step progress of an engine: is it still working on the requests it holds?

vLLM's `check_health` only reads an error flag, so an engine core that hangs (a stuck
kernel, a deadlock, a process stopped by SIGSTOP) looks healthy while every stream on it
waits forever. `StepProgress` notices it from two sources:
- each engine step the engine reports (vLLM's stat logger, once per step, with the
  requests the scheduler still holds: running + waiting);
- the replica's own requests: streams open on the engine, and those submitted since the
  last reported step.
The engine owes work when its last step left requests that a stream still waits on, or
when a request was submitted after it; `stalled_for` is how long it has owed work
without a step. An idle engine is never stalled, nor one whose only open streams are
finished in the engine but not yet read by a slow client, nor one whose last request was
aborted (the engine sends no step after an abort, so its last count is stale: the closed
stream bounds it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["StepProgress"]


class StepProgress:
    """Open streams, the engine's last reported load, and the time of its last step. Fed
    and read on one event loop (the stat logger runs in AsyncLLM's output handler)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.open = 0  # streams open on the engine
        self.held = 0  # requests the scheduler held after its last step
        self.new = 0  # requests submitted since that step
        self.last_step = clock()

    @property
    def owed(self) -> int:
        """Requests the engine should be stepping on now."""
        return min(self.held, self.open) + self.new

    def begin(self) -> None:
        """A request is submitted (its stream opens)."""
        if self.owed == 0:  # idle until now: no step was owed, so none is late
            self.last_step = self._clock()
        self.open += 1
        self.new += 1

    def end(self) -> None:
        """A stream closed (finished, failed or aborted)."""
        self.open = max(0, self.open - 1)
        self.new = min(self.new, self.open)

    def step(self, running: int, waiting: int) -> None:
        """The engine reported a step; the scheduler holds `running + waiting` requests."""
        self.last_step = self._clock()
        self.held = running + waiting
        self.new = 0

    def stalled_for(self) -> float:
        """Seconds the engine has owed work without a step (0 when it owes none)."""
        if self.owed == 0:
            return 0.0
        return max(0.0, self._clock() - self.last_step)

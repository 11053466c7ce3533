"""Ctrl-C / SIGTERM handling shared by the long-running commands (`up`, `traces`)."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StopSignals"]


class StopSignals:
    """`stop` is set by SIGINT/SIGTERM; a second signal interrupts at once (KeyboardInterrupt).

    A context manager that restores the previous handlers on exit. Call `install()` again
    after ray.init: Ray's core installs its own SIGTERM handler (a stack dump, then abort).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()

    def install(self) -> None:
        for sig in self.SIGNALS:
            old = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, old)

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)

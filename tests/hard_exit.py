"""End the pytest process once its shutdown is done, before the interpreter tears modules down.

CI ran the whole suite, every test finished, and the process then died with SIGSEGV (exit 139)
while CPython finalized its modules: triton's nanobind extension (imported through vLLM) reported
hundreds of "leaked" types and something freed during that teardown crashed. Nothing a test
checks happens there, but a crash there turns a green run red.

`install()` registers an atexit handler at conftest import, before Ray, vLLM or torch register
theirs; atexit runs handlers last-registered first, so this one runs after all of them (and after
non-daemon threads were joined). It shuts logging down (whose handler was registered earlier and
would be skipped), flushes, and leaves with pytest's own exit status through `os._exit`, so the
module teardown never runs. `AGENTSERVE_PYTEST_HARD_EXIT=0` keeps the ordinary exit (to debug it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys

ENV = "AGENTSERVE_PYTEST_HARD_EXIT"
_sessions: list = []


def install() -> None:
    if os.environ.get(ENV, "1") != "0":
        atexit.register(_exit_now)


def remember(session) -> None:
    """Called from pytest_sessionfinish: the session whose final exit status is pytest's."""
    _sessions.append(session)


def _exit_now() -> None:
    if not _sessions:  # pytest stopped before a session ran (usage error): exit as usual
        return
    status = int(_sessions[-1].exitstatus)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    os._exit(status)

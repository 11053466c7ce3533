"""Meta-validation of one JSON Schema (is it a valid schema?), the expensive part of
checking a request's tools, in this process or in a child process.

The ingress checks schemas it has not seen from a tenant before in `SchemaProcess`'s
child: the work is pure CPU in jsonschema, and in the ingress's own process it would hold
the GIL that the event loop needs for every other tenant's requests. A process has its
own GIL, so a tenant flooding the ingress with new schemas costs the others a core's
share at most, not the loop's latency; the child runs at a lower priority (CHILD_NICE),
so on a busy CPU the loop goes first. Results are small ((path, message) or None), the
schema travels as its canonical JSON text. Light imports only: the child imports this
module alone (and, for `run`, the module of the function it is given).

The same child decodes request bodies over admission/parsing.py's INLINE_BODY_BYTES
(api/body_check.py): json.loads is C code that holds the GIL for the whole document
(20-90 ms for 4 MiB of small values), which no thread can interleave with the loop.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing import get_context
from typing import Any, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

__all__ = [
    "SchemaProcess",
    "SchemaTimeoutError",
    "schema_error",
    "schema_text_error",
    "shared_schema_process",
]

Result = tuple[str, str] | None
T = TypeVar("T")
STARTUP_S = 120.0  # a spawned child re-imports the parent's main module: seconds, not ms
CHILD_NICE = 10  # the child yields the CPU to the ingress's own loop (and its replies)


def schema_error(schema: dict[str, Any]) -> Result:
    """None when `schema` is a valid JSON Schema, else (path inside it, message)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as err:
        inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.path)
        return inner, err.message
    return None


def schema_text_error(text: str) -> Result:
    """schema_error of a schema given as JSON text (what the child receives)."""
    return schema_error(json.loads(text))


def _lower_priority() -> None:
    """In the child: run at CHILD_NICE, so that on a busy CPU the ingress's event loop (every
    tenant's latency) goes before new schemas (one tenant's validation throughput)."""
    with contextlib.suppress(OSError):  # not permitted here: the parent's priority
        os.nice(CHILD_NICE)


class SchemaTimeoutError(TimeoutError):
    """The child did not answer within the time allowed (it is replaced)."""


class SchemaProcess:
    """One child process that meta-validates schemas, started on first use. `check` blocks
    the calling thread (not holding the GIL) until the child answers; a child that takes
    longer than `timeout_s` on one schema is killed and replaced, and the call raises
    SchemaTimeoutError. Until the child is up, and where none can be started
    (AGENTSERVE_SCHEMA_PROCESS=0, or a platform without process support), schemas are
    checked in the calling thread."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self.in_process = os.environ.get("AGENTSERVE_SCHEMA_PROCESS", "1") == "0"
        self._pool: ProcessPoolExecutor | None = None
        self._ready = threading.Event()  # the child answered its first check
        self._lock = threading.Lock()
        self._closed = self._started = False

    def check(self, schema: dict[str, Any], text: str) -> Result:
        """(path, message) or None; in the calling thread until the child is up (the first
        call starts it: no child for a process that never sees a new schema)."""
        return self.run(schema_text_error, (text,), lambda: schema_error(schema))

    def run(self, fn: Callable[..., T], args: tuple[Any, ...], local: Callable[[], T]) -> T:
        """`fn(*args)` in the child (`fn` a module-level function of a light module, its
        arguments and result picklable), or `local()` in the calling thread until the child
        is up. The first call starts the child. SchemaTimeoutError past timeout_s."""
        pool = self._pool if self._ready.is_set() else None
        if pool is None:
            if not self.in_process and not self._started:
                self._start()
            return local()
        try:
            future = pool.submit(fn, *args)
        except RuntimeError:  # the pool broke or closed under us: answer here
            return local()
        try:
            return future.result(self.timeout_s)
        except FutureTimeout:
            self._replace(pool)
            raise SchemaTimeoutError(f"child call took over {self.timeout_s:g} s") from None

    def ready(self, timeout_s: float = STARTUP_S) -> bool:
        """Start the child if needed and wait until it answers (at most `timeout_s`);
        whether it is up (False at once where no child is used). For callers that must
        not pay the in-thread fallback later (a measurement, a warm-up)."""
        if self.in_process:
            return False
        if not self._started and not self._ready.is_set():
            self._start()
        return self._ready.wait(timeout_s)

    def _start(self) -> None:
        """Start a child in the background (a spawned interpreter takes seconds to come up:
        until it answers, schemas are checked in the calling thread)."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
        threading.Thread(target=self._warm, name="agentserve-schema-child", daemon=True).start()

    def _warm(self) -> None:
        try:
            pool = ProcessPoolExecutor(
                1, mp_context=get_context("spawn"), initializer=_lower_priority
            )
            pool.submit(schema_text_error, "{}").result(STARTUP_S)
        except Exception:  # no child here (or it failed to come up): stay in-thread
            with self._lock:
                self.in_process, self._started = True, False
            return
        with self._lock:
            self._started = False
            if self._closed:
                pool.shutdown(wait=False, cancel_futures=True)
                return
            self._pool = pool
            self._ready.set()

    def _replace(self, pool: ProcessPoolExecutor) -> None:
        """Kill a child stuck on a schema and start another."""
        with self._lock:
            if self._pool is not pool:
                return  # another thread replaced it already
            self._pool = None
            self._ready.clear()
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()  # a schema that hangs jsonschema: the child cannot be asked
        pool.shutdown(wait=False, cancel_futures=True)
        if not self._closed:
            self._start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


_SHARED: SchemaProcess | None = None
_SHARED_LOCK = threading.Lock()


def shared_schema_process() -> SchemaProcess:
    """The process-wide SchemaProcess (one child per ingress process, however many
    parsers it builds); closed at exit."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = SchemaProcess()
            atexit.register(_SHARED.close)
        return _SHARED

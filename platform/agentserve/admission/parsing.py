"""Request parsing that keeps the ingress event loop free and is fair across tenants: a
request with tool or response_format schemas its tenant has not sent before, or a body
over INLINE_BODY_BYTES, is decoded and validated on a worker thread under a time limit;
a small one without schemas, or with only known ones (an agent's usual tools: a hash
each), inline.

Fairness (admission/fair_gate.py): worker threads take turns through a FairGate, so one
validation runs at a time (a hostile request competes with the event loop for the GIL,
never with a crowd of threads), and a job hands its turn to another tenant's at every
checkpoint (before each uncached schema, every few thousand JSON values). A tenant has
at most PER_TENANT_JOBS jobs on the threads; its further requests wait in its own queue,
and past the time limit get 429 (validation_busy): they never hold threads another
tenant needs (WORKER_THREADS serve 8 tenants at once; more wait for a thread in order).
Work left when the limit passes stops at the next checkpoint (400 validation_timeout).
A large body is decoded in the schema child process (api/body_check.py), on its tenant's
turn: json.loads holds the GIL for the whole document, which a thread cannot interleave
with the loop; the lists and constraints past api/limits.py are refused there, so a
hostile 4 MiB body never becomes objects here.
Meta-validated schemas are cached per tenant (SchemaCache partitions): no tenant evicts
another's entries or learns from the timing whether another tenant sent a schema. The
meta-validation itself (jsonschema's check_schema, the bulk of the work) runs in a child
process (api/schema_check.py SchemaProcess): the worker thread waits for it without the
GIL, so a flood of new schemas no longer takes the event loop's GIL.

While a validation runs, the event loop waits for the GIL at most sys.getswitchinterval()
each time it needs it; a request passes through the loop a dozen times, so the parser
lowers the interval to GIL_SWITCH_S (CPython's default is 5 ms), and a validation rests
REST_S after each WORK_SLICE_S of work (at its checkpoints), so the loop also finds the
GIL free: measured in tests/reliability/tool_schemas.py, these keep other tenants'
latency near its quiet value while a tenant floods the worker with schemas.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from agentserve.admission.fair_gate import FairGate
from agentserve.api.auth import OPEN_TENANT
from agentserve.api.body import decode_json
from agentserve.api.body_check import decode_checked, decoded_or_raise
from agentserve.api.errors import RateLimitError
from agentserve.api.openai import parse_request
from agentserve.api.schema_check import shared_schema_process
from agentserve.api.validate import (
    SchemaCache,
    ValidationTimeoutError,
    all_cached,
    check_tool_limits,
    has_schemas,
)
from agentserve.engine.protocol import RequestKind

__all__ = ["INLINE_BODY_BYTES", "VALIDATION_TIMEOUT_S", "RequestParser"]

INLINE_BODY_BYTES = 64 * 1024  # larger bodies are decoded and checked off the loop
VALIDATION_TIMEOUT_S = 5.0
PER_TENANT_JOBS = 2  # validation jobs of one tenant on the worker threads at once
WORKER_THREADS = 16
TENANT_CACHE_ENTRIES = 1024  # meta-validation results kept per tenant
GIL_SWITCH_S = 0.001
WORK_SLICE_S, REST_S = 0.001, 0.001  # validation takes at most half of the GIL


class RequestParser:
    """bytes -> validated vLLM request, off the event loop when heavy."""

    def __init__(self, max_model_len: Mapping[str, int], timeout_s: float = VALIDATION_TIMEOUT_S):
        self.max_model_len = dict(max_model_len)
        self.timeout_s = timeout_s
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self.gate = FairGate()
        self._caches: dict[str, SchemaCache] = {}
        self.schemas = shared_schema_process()  # new schemas are checked in a child process
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._worker = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="agentserve-validate")

    def cache(self, tenant: str) -> SchemaCache:
        """`tenant`'s partition of the schema cache."""
        if tenant not in self._caches:
            self._caches[tenant] = SchemaCache(TENANT_CACHE_ENTRIES, self.schemas.check)
        return self._caches[tenant]

    async def parse(
        self,
        kind: RequestKind,
        raw: bytes,
        translate: Callable[[Any], Any] | None = None,
        tenant: str = OPEN_TENANT,
    ) -> Any:
        """decode, then validate: one call."""
        data = await self.decode(raw, translate, tenant)
        return await self.validate(kind, data, tenant, large=len(raw) > INLINE_BODY_BYTES)

    async def decode(
        self, raw: bytes, translate: Callable[[Any], Any] | None = None, tenant: str = OPEN_TENANT
    ) -> Any:
        """The decoded (and translated) body: inline up to INLINE_BODY_BYTES, else on a
        worker's turn. InvalidRequestError (400)."""
        if len(raw) <= INLINE_BODY_BYTES:
            return _decode(raw, translate)
        return await self._job(tenant, lambda checkpoint: self._decode_large(raw, translate))

    def _decode_large(self, raw: bytes, translate: Callable[[Any], Any] | None) -> Any:
        """On a worker's turn: decoded in the child process (api/body_check.py), lists
        past their limits refused there (a body to translate is checked after, as usual);
        in this thread until the child is up."""
        check = translate is None
        checked = self.schemas.run(decode_checked, (raw, check), lambda: decode_checked(raw, check))
        data = decoded_or_raise(checked)
        return translate(data) if translate is not None else data

    def heavy(self, data: Any) -> bool:
        """Whether validating `data` goes to the worker threads (schemas to check); the
        cheap tools-count refusal is made here, on the loop."""
        if not (isinstance(data, dict) and has_schemas(data)):
            return False
        check_tool_limits(data)
        return True

    async def validate(
        self, kind: RequestKind, data: Any, tenant: str = OPEN_TENANT, *, large: bool = False
    ) -> Any:
        """The validated request: inline when light (no schemas, not `large`: a body past
        INLINE_BODY_BYTES), else a worker job. InvalidRequestError
        (400), RateLimitError (429: the tenant's own queue is past the time limit),
        OverloadedError (503: other tenants' validations left no turn in time)."""
        if not self.heavy(data) and not large:
            return parse_request(kind, data, self.max_model_len)
        cache = self.cache(tenant)
        if not large and all_cached(data, cache):  # an agent's usual tools: a hash each
            return parse_request(kind, data, self.max_model_len, schema_cache=cache)
        return await self._job(
            tenant,
            lambda checkpoint: parse_request(
                kind, data, self.max_model_len, schema_cache=cache, checkpoint=checkpoint
            ),
        )

    async def _job(self, tenant: str, work: Callable[[Callable[[], None]], Any]) -> Any:
        """Run `work(checkpoint)` on a worker's turn, at most PER_TENANT_JOBS of `tenant`'s
        at once, all within timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        slot = self._slots.setdefault(tenant, asyncio.Semaphore(PER_TENANT_JOBS))
        try:
            if slot.locked():  # the tenant's own queue
                await asyncio.wait_for(slot.acquire(), self.timeout_s)
            else:
                await slot.acquire()
        except TimeoutError:
            raise RateLimitError(
                f"More than {PER_TENANT_JOBS} of this tenant's requests are having their "
                f"schemas checked and this one waited {self.timeout_s:g} s; send fewer at "
                "once.",
                code="validation_busy",
            ) from None
        job = partial(self._run, tenant, deadline, work)
        try:
            future = asyncio.get_running_loop().run_in_executor(self._worker, job)
        except BaseException:
            slot.release()
            raise
        future.add_done_callback(lambda _: slot.release())  # when the thread is done with it
        left = max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(future), left + 0.5)
        except TimeoutError:
            raise ValidationTimeoutError(self.timeout_s) from None

    def _run(self, tenant: str, deadline: float, work: Callable[[Callable[[], None]], Any]) -> Any:
        with self.gate.turn(tenant, deadline) as turn:
            busy_since = [time.monotonic()]

            def checkpoint() -> None:
                now = time.monotonic()
                if now > deadline:
                    raise ValidationTimeoutError(self.timeout_s)
                if now - busy_since[0] >= WORK_SLICE_S:  # leave the GIL to the loop a while
                    time.sleep(REST_S)
                    busy_since[0] = time.monotonic()
                turn.checkpoint()

            return work(checkpoint)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


def _decode(raw: bytes, translate: Callable[[Any], Any] | None) -> Any:
    data = decode_json(raw)
    return translate(data) if translate is not None else data

"""Request parsing that keeps the ingress event loop free: a request with tool or
response_format schemas, or a large body, is decoded and validated on one worker thread
under a time limit; a small plain one inline. Meta-validated schemas are cached.

One worker thread: a hostile request competes with the event loop for the GIL, never
with a crowd of threads, so other tenants' streams keep their pace (Python hands the GIL
over every sys.getswitchinterval(), 5 ms). Work left when the limit passes stops at the
next schema (validate.check_schemas' deadline); a request still queued then gets 503.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from agentserve.api.body import decode_json
from agentserve.api.errors import OverloadedError
from agentserve.api.openai import parse_request
from agentserve.api.validate import (
    SchemaCache,
    ValidationTimeoutError,
    check_tool_limits,
    has_schemas,
)
from agentserve.engine.protocol import RequestKind

__all__ = ["INLINE_BODY_BYTES", "VALIDATION_TIMEOUT_S", "RequestParser"]

INLINE_BODY_BYTES = 64 * 1024  # larger bodies are decoded and checked off the loop
VALIDATION_TIMEOUT_S = 5.0


class RequestParser:
    """bytes -> validated vLLM request, off the event loop when heavy."""

    def __init__(self, max_model_len: Mapping[str, int], timeout_s: float = VALIDATION_TIMEOUT_S):
        self.max_model_len = dict(max_model_len)
        self.timeout_s = timeout_s
        self.cache = SchemaCache()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="agentserve-validate")

    async def parse(
        self, kind: RequestKind, raw: bytes, translate: Callable[[Any], Any] | None = None
    ) -> Any:
        """InvalidRequestError (400) for a bad request, OverloadedError (503) when the
        validation worker is too busy to start it within the time limit. `translate`
        maps the decoded body first (a /v1/responses body to a chat one)."""
        if len(raw) <= INLINE_BODY_BYTES:
            data = decode_json(raw)
            if translate is not None:
                data = translate(data)
            if not (isinstance(data, dict) and has_schemas(data)):
                return parse_request(kind, data, self.max_model_len)
            check_tool_limits(data)  # the cheap refusal needs no thread
        else:
            data = None
        deadline = time.monotonic() + self.timeout_s
        job = partial(self._parse, kind, raw, data, deadline, translate)
        future = asyncio.get_running_loop().run_in_executor(self._worker, job)
        try:
            return await asyncio.wait_for(future, self.timeout_s + 0.5)
        except TimeoutError:
            raise ValidationTimeoutError(self.timeout_s) from None

    def _parse(
        self,
        kind: RequestKind,
        raw: bytes,
        data: Any,
        deadline: float,
        translate: Callable[[Any], Any] | None,
    ) -> Any:
        if time.monotonic() > deadline:
            raise OverloadedError(
                "the ingress is busy validating other requests' schemas; retry later"
            )
        if data is None:
            data = decode_json(raw)
            if translate is not None:
                data = translate(data)
        return parse_request(
            kind, data, self.max_model_len, schema_cache=self.cache, deadline=deadline
        )

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

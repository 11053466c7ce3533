"""The engine request of an admitted request, built once from the parsed body and the
ingress's decisions (engine priority, prefix-cache salt, headers); neither is changed.

The parsed body stays as the client sent it (validated): the poison list fingerprints
it (serve/poison.py) and admission reads it. What the engine sees is a copy with the
decisions set (pydantic `model_copy(update=...)`: the fields count as set, so a
continuation carries them over, engine/vllm_engine.py `_CARRIED`). Later copies derive
from this request only: one per choice (serve/fanout.py), a continuation after a replica
death (serve/migrate.py), the engine's streaming options (engine/vllm_engine.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span

from agentserve.engine.protocol import EngineRequest, RequestKind
from agentserve.serve import spans

__all__ = ["PASSED_HEADERS", "engine_headers", "engine_request"]

PASSED_HEADERS = (spans.SESSION_HEADER, "x-request-id")  # client headers passed on as sent


def engine_headers(span: Span, incoming: Mapping[str, str], tenant: str) -> dict[str, str]:
    """Headers for the engine request: trace context and send time (serve/spans.py), the
    client's session and request ids, the tenant (for the replica's windows)."""
    headers = spans.trace_headers(span, incoming)
    for name in PASSED_HEADERS:
        if name in incoming:
            headers[name] = incoming[name]
    headers[spans.TENANT_HEADER] = tenant
    return headers


def engine_request(
    kind: RequestKind,
    parsed: Any,
    *,
    request_id: str,
    headers: Mapping[str, str],
    priority: int | None,
    cache_salt: str | None,
    adapter: str | None = None,
) -> EngineRequest:
    """A new EngineRequest whose body is `parsed` with the decisions set (pure: `parsed`
    is not changed). None leaves a field as parsed: `priority` None when the model's
    engine does not schedule by priority (admission/priority.py), `cache_salt` None keeps the
    client's (the ingress always salts: api/cache_salt.py). `adapter`: the LoRA adapter
    the request named, as the body's `model` (vLLM's serving layer selects it by that
    name: engine/vllm_lora.py); None keeps the base model's."""
    decisions = (("priority", priority), ("cache_salt", cache_salt), ("model", adapter))
    update = {name: value for name, value in decisions if value is not None}
    body = parsed.model_copy(update=update) if update else parsed
    return EngineRequest(request_id, kind, body, dict(headers))

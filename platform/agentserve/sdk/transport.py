"""The HTTP client under every model call: W3C `traceparent` from the active span, the
conversation id as `x-session-id`, and the server's finish reasons on the chat span.

The active span is the first one a resolver returns (the OpenAI Agents SDK's current span,
mapped to OTel by agents_tracing), else OTel's current span (Pydantic AI and user spans).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentserve import tracing as t
from agentserve.sdk.context import current_conversation_id

__all__ = ["SESSION_HEADER", "TraceHeaders", "http_client"]

SESSION_HEADER = "x-session-id"
SpanResolver = Callable[[], Span | None]
_W3C = TraceContextTextMapPropagator()


class TraceHeaders:
    """httpx event hooks; `resolvers` find the span that makes this model call."""

    def __init__(self, resolvers: Sequence[SpanResolver] = ()):
        self.resolvers = list(resolvers)

    def active_span(self) -> Span:
        for resolve in self.resolvers:
            span = resolve()
            if span is not None and span.get_span_context().is_valid:
                return span
        return trace.get_current_span()

    async def on_request(self, request: Any) -> None:
        """Set traceparent (replacing any) and x-session-id (unless the caller set one)."""
        span = self.active_span()
        if span.get_span_context().is_valid:
            carrier: dict[str, str] = {}
            _W3C.inject(carrier, context=trace.set_span_in_context(span))
            for name, value in carrier.items():
                request.headers[name] = value
        session = current_conversation_id()
        if session and SESSION_HEADER not in request.headers:
            request.headers[SESSION_HEADER] = session

    async def on_response(self, response: Any) -> None:
        """For non-streamed chat completions, record finish reasons and the response id."""
        span = self.active_span()
        if not span.is_recording() or not _is_json(response):
            return
        try:
            body = json.loads(await response.aread())
        except Exception:  # an unreadable body is the openai client's problem, not ours
            return
        if isinstance(body, dict):
            record_response(span, body)


def _is_json(response: Any) -> bool:
    kind = response.headers.get("content-type", "")
    return response.request.url.path.endswith("/chat/completions") and "json" in kind


def record_response(span: Span, body: dict) -> None:
    """Copy finish reasons, response id/model and usage of a chat completion onto `span`."""
    reasons = [c.get("finish_reason") for c in body.get("choices") or [] if isinstance(c, dict)]
    reasons = [r for r in reasons if r]
    if reasons:
        span.set_attribute(t.FINISH_REASONS, reasons)
    if body.get("id"):
        span.set_attribute(t.RESPONSE_ID, str(body["id"]))
    if body.get("model"):
        span.set_attribute(t.RESPONSE_MODEL, str(body["model"]))
    usage = body.get("usage") or {}
    if isinstance(usage, dict) and "prompt_tokens" in usage:
        span.set_attribute(t.INPUT_TOKENS, int(usage["prompt_tokens"]))
        span.set_attribute(t.OUTPUT_TOKENS, int(usage.get("completion_tokens") or 0))


def http_client(hooks: TraceHeaders, timeout_s: float, transport: Any = None) -> Any:
    """The openai package's async HTTP client with `hooks` installed and a per-call timeout
    (`transport` replaces the network, e.g. an ASGI transport in tests)."""
    import openai

    kwargs = {"transport": transport} if transport is not None else {}
    return openai.DefaultAsyncHttpxClient(
        timeout=timeout_s,
        event_hooks={"request": [hooks.on_request], "response": [hooks.on_response]},
        **kwargs,
    )

"""OpenAI Agents SDK traces -> OTel GenAI spans (a TracingProcessor).

Mapping (Agents SDK span data -> OTel span):
  trace (workflow)         -> `invoke_workflow {name}` root, gen_ai.conversation.id = group_id
  AgentSpanData            -> `invoke_agent {name}`
  FunctionSpanData         -> `execute_tool {name}` (an agent used as a tool nests its run)
  GenerationSpanData /
  ResponseSpanData         -> `chat {model}` with request model, usage and finish reasons
  HandoffSpanData          -> `handoff {to_agent}`
  Guardrail/Custom/MCP     -> `{type} {name}`; task and turn spans are folded into their parent
Parents follow the Agents SDK's parent ids, so sub-agents, tools and model calls form one
tree; `current_otel_span` gives transport.py the span of the model call in flight.
Errors on an Agents span set the OTel status to ERROR with the message (the run goes on).

`gen_ai.tool.call.id`: the SDK puts no call id on its function spans, but the model call
before them records the tool calls it returned (when the run records data: the SDK's
`trace_include_sensitive_data`, on by default). Their ids are queued per parent span and
tool name, and each `execute_tool` span started under that parent takes the next one, in
the order the SDK runs the calls (the order the model returned them). Without recorded
output the attribute is left out, not guessed.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Any
from urllib.parse import urlsplit

from agents.tracing import TracingProcessor, get_current_span
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from agentserve import tracing as t
from agentserve.sdk.context import current_conversation_id

__all__ = ["GenAITraceProcessor"]

_FOLDED = ("task", "turn")
_CHAT = ("generation", "response")


class GenAITraceProcessor(TracingProcessor):
    """Maps Agents SDK traces and spans onto OTel spans made by `tracer` (thread-safe)."""

    def __init__(
        self, tracer: Tracer, default_model: str | None = None, *, capture_content: bool = False
    ):
        """`capture_content`: record tool results (`gen_ai.tool.call.result`), which the
        GenAI conventions make opt-in: they may hold user data and secrets."""
        self.tracer = tracer
        self.default_model = default_model
        self.capture_content = capture_content
        self._lock = threading.Lock()
        self._spans: dict[str, Span] = {}  # Agents trace/span id -> OTel span
        self._conversation: dict[str, str] = {}  # Agents trace id -> group id
        # OTel parent span -> tool name -> call ids the last model call there returned
        self._calls: dict[Span, dict[str, deque[str]]] = {}

    # -- traces ----------------------------------------------------------------------------------
    def on_trace_start(self, trace_: Any) -> None:
        attributes = {
            t.OPERATION: "invoke_workflow",
            t.WORKFLOW_NAME: trace_.name,
            t.PROVIDER: t.PROVIDER_NAME,
        }
        group = getattr(trace_, "group_id", None)
        if group:
            attributes[t.CONVERSATION_ID] = group
        # no explicit parent: under a user's current OTel span if there is one, else a root
        span = self.tracer.start_span(f"invoke_workflow {trace_.name}", attributes=attributes)
        with self._lock:
            self._spans[trace_.trace_id] = span
            if group:
                self._conversation[trace_.trace_id] = group

    def on_trace_end(self, trace_: Any) -> None:
        with self._lock:
            span = self._spans.pop(trace_.trace_id, None)
            self._conversation.pop(trace_.trace_id, None)
        if span is not None:
            span.end()

    # -- spans -----------------------------------------------------------------------------------
    def on_span_start(self, span: Any) -> None:
        data = span.span_data
        parent = self._parent(span)
        if data.type in _FOLDED:
            with self._lock:  # children of a folded span hang off its parent
                if parent is not None:
                    self._spans[span.span_id] = parent
            return
        name, kind, attributes = self._describe_start(data)
        if data.type == "function" and parent is not None:
            call_id = self._next_call_id(parent, data.name)
            if call_id:
                attributes[t.TOOL_CALL_ID] = call_id
        conversation = self._conversation.get(span.trace_id) or current_conversation_id()
        if conversation:
            attributes[t.CONVERSATION_ID] = conversation
        context = trace.set_span_in_context(parent) if parent is not None else None
        otel = self.tracer.start_span(name, context=context, kind=kind, attributes=attributes)
        with self._lock:
            self._spans[span.span_id] = otel

    def on_span_end(self, span: Any) -> None:
        data = span.span_data
        with self._lock:
            otel = self._spans.pop(span.span_id, None)
            if data.type not in _FOLDED:  # a folded span's entry is its parent's span
                self._calls.pop(otel, None)  # calls not run by the end never will be
        if otel is None or data.type in _FOLDED:
            return
        if data.type in _CHAT:
            self._queue_calls(span, data)
        error = span.error
        _record_end(otel, data, self.capture_content and not error)
        if error:
            otel.set_status(Status(StatusCode.ERROR, str(error.get("message", "error"))))
            otel.set_attribute(t.ERROR_TYPE, f"{data.type}_error")  # a class, not the text
        otel.end()

    def shutdown(self) -> None:
        with self._lock:
            spans, self._spans = list(self._spans.values()), {}
        for span in spans:
            if span.is_recording():
                span.end()

    def force_flush(self) -> None:
        """Nothing buffered here; the OTel provider's processors flush themselves."""

    # -- helpers ---------------------------------------------------------------------------------
    def current_otel_span(self) -> Span | None:
        """The OTel span of the Agents SDK span current in this context (or None)."""
        current = get_current_span()
        if current is None:
            return None
        with self._lock:
            return self._spans.get(current.span_id)

    def _queue_calls(self, span: Any, data: Any) -> None:
        """Queue the tool calls a model call returned for the tool spans that follow it."""
        calls = _tool_calls(data)
        parent = self._parent(span)
        if parent is None or not calls:
            return
        queued: dict[str, deque[str]] = {}
        for name, call_id in calls:
            queued.setdefault(name, deque()).append(call_id)
        with self._lock:
            self._calls[parent] = queued  # a new model call replaces what is left

    def _next_call_id(self, parent: Span, tool: str) -> str | None:
        with self._lock:
            queued = self._calls.get(parent, {}).get(tool)
            return queued.popleft() if queued else None

    def _parent(self, span: Any) -> Span | None:
        with self._lock:
            if span.parent_id and span.parent_id in self._spans:
                return self._spans[span.parent_id]
            return self._spans.get(span.trace_id)

    def _describe_start(self, data: Any) -> tuple[str, SpanKind, dict[str, Any]]:
        """(span name, kind, attributes) for an Agents span data at its start."""
        kind = data.type
        if kind == "agent":
            attrs = {
                t.OPERATION: "invoke_agent",
                t.AGENT_NAME: data.name,
                t.PROVIDER: t.PROVIDER_NAME,
            }
            return f"invoke_agent {data.name}", SpanKind.INTERNAL, attrs
        if kind == "function":
            attrs = {t.OPERATION: "execute_tool", t.TOOL_NAME: data.name, t.TOOL_TYPE: "function"}
            return f"execute_tool {data.name}", SpanKind.INTERNAL, attrs
        if kind in _CHAT:
            model = _model_of(data) or self.default_model
            attrs = {t.OPERATION: "chat", t.PROVIDER: t.PROVIDER_NAME, **_request_config(data)}
            if not model:  # conditionally required "if available": left out, not made up
                return "chat", SpanKind.CLIENT, attrs
            return f"chat {model}", SpanKind.CLIENT, {**attrs, t.REQUEST_MODEL: model}
        if kind == "handoff":
            attrs = {"agentserve.handoff.from": data.from_agent or ""}
            return f"handoff {data.to_agent}", SpanKind.INTERNAL, attrs
        label = getattr(data, "name", None) or getattr(data, "server", None) or ""
        return f"{kind} {label}".strip(), SpanKind.INTERNAL, {}


# ModelSettings keys -> GenAI request attributes, for a model call's recorded config
_SETTINGS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


def _request_config(data: Any) -> dict[str, Any]:
    """The request parameters and server address a model call's `model_config` records."""
    config = getattr(data, "model_config", None) or {}
    found = {key: config[name] for name, key in _SETTINGS.items() if config.get(name) is not None}
    url = urlsplit(str(config.get("base_url") or ""))
    if url.hostname:
        found["server.address"] = url.hostname
        with contextlib.suppress(ValueError):  # a malformed port: the address alone
            found["server.port"] = url.port or (443 if url.scheme == "https" else 80)
    return found


def _model_of(data: Any) -> str | None:
    model = getattr(data, "model", None)
    if model:
        return str(model)
    response = getattr(data, "response", None)
    return str(getattr(response, "model", "") or "") or None


def _record_end(otel: Span, data: Any, capture_content: bool = False) -> None:
    """Attributes known only at the end: usage and finish reasons (chat), the result (tool,
    with `capture_content`). Usage the SDK does not know (a streamed run without
    include_usage reports 0 / 0) and a finish reason it does not report are left out, not
    made up: the server's spans carry the real ones."""
    if not otel.is_recording():
        return
    if data.type == "generation":
        usage = data.usage or {}
        inputs, outputs = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
        if inputs or outputs:
            otel.set_attribute(t.INPUT_TOKENS, inputs)
            otel.set_attribute(t.OUTPUT_TOKENS, outputs)
        recorded = getattr(otel, "attributes", None) or {}  # the response's own (transport.py)
        if t.FINISH_REASONS not in recorded and _has_tool_calls(data.output):
            otel.set_attribute(t.FINISH_REASONS, ["tool_calls"])  # what the output shows
    elif data.type == "response" and getattr(data, "response", None) is not None:
        for key, value in ((t.RESPONSE_ID, "id"), (t.RESPONSE_MODEL, "model")):
            if getattr(data.response, value, None):
                otel.set_attribute(key, str(getattr(data.response, value)))
        usage = getattr(data.response, "usage", None)
        if usage is not None:
            otel.set_attribute(t.INPUT_TOKENS, int(getattr(usage, "input_tokens", 0) or 0))
            otel.set_attribute(t.OUTPUT_TOKENS, int(getattr(usage, "output_tokens", 0) or 0))
    elif data.type == "function" and data.output is not None and capture_content:
        otel.set_attribute("gen_ai.tool.call.result", str(data.output)[:2000])


def _tool_calls(data: Any) -> list[tuple[str, str]]:
    """(tool name, call id) of the tool calls a model call's recorded output holds."""
    if data.type == "generation":
        return _generation_calls(data.output)
    return _response_calls(getattr(getattr(data, "response", None), "output", None))


def _generation_calls(output: Any) -> list[tuple[str, str]]:
    """The same from a generation span's output: Chat Completions messages, or the
    Responses-shaped dump a streamed run records there instead."""
    found: list[tuple[str, str]] = []
    for message in output or []:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            function = (call.get("function") if isinstance(call, dict) else None) or {}
            if function.get("name") and call.get("id"):
                found.append((str(function["name"]), str(call["id"])))
        found.extend(_response_calls(message.get("output")))
    return found


def _response_calls(items: Any) -> list[tuple[str, str]]:
    """(name, call id) of the `function_call` items of a Responses output (objects or
    their dicts)."""
    found = []
    for item in items or []:
        get = item.get if isinstance(item, dict) else lambda key, i=item: getattr(i, key, None)
        if get("type") == "function_call" and get("call_id") and get("name"):
            found.append((str(get("name")), str(get("call_id"))))
    return found


def _has_tool_calls(output: Any) -> bool:
    return bool(_generation_calls(output))

"""connect(): point the agent frameworks in this process at agentserve, traced end to end.

What it configures, for each framework that is installed:
- OpenAI Agents SDK (`agents`): the default client (our AsyncOpenAI), the Chat Completions
  API (agentserve serves /v1/chat/completions), the default model, and its trace
  processors replaced by GenAITraceProcessor (nothing is uploaded to OpenAI).
- Pydantic AI: `Agent.instrument_all` with our tracer provider (its spans already follow
  the GenAI conventions); `Connection.pydantic_ai_model()` is the model to pass.
Both share one HTTP client whose hooks add `traceparent` and `x-session-id` (transport.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from agentserve import tracing as t
from agentserve.sdk.otel import SpanRecorder, format_tree, make_sdk_provider
from agentserve.sdk.server_env import resolve_api_key, resolve_base_url
from agentserve.sdk.transport import TraceHeaders, http_client
from agentserve.sources.models import BUNDLED_MODEL

__all__ = ["CAPTURE_ENV", "Connection", "connect"]

# the GenAI conventions' switch for recording message content (prompts, completions, tool
# results) on spans; off unless "true"
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

DEFAULT_MODEL = BUNDLED_MODEL  # the bundled model `agentserve up` serves
TREE_ATTRIBUTES = (t.CONVERSATION_ID, t.INPUT_TOKENS, t.OUTPUT_TOKENS, t.FINISH_REASONS)


@dataclass
class Connection:
    """A connected process: the client, its tracer provider and local span recorder."""

    base_url: str
    model: str
    client: Any  # openai.AsyncOpenAI
    tracer_provider: TracerProvider
    recorder: SpanRecorder
    export_endpoint: str | None
    frameworks: list[str] = field(default_factory=list)

    def pydantic_ai_model(self, model: str | None = None) -> Any:
        """A Pydantic AI model served by agentserve (pass it to `pydantic_ai.Agent`)."""
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        return OpenAIChatModel(
            model or self.model, provider=OpenAIProvider(openai_client=self.client)
        )

    def trace_tree(self, trace_id: int | None = None, attributes=TREE_ATTRIBUTES) -> str:
        """The recorded spans (of `trace_id`, default the latest trace) as an indented tree."""
        self.tracer_provider.force_flush(2_000)  # the local recorder is synchronous; an
        spans = self.recorder.spans()  # OTLP exporter waits at most this long
        if not spans:
            return ""
        trace_id = trace_id if trace_id is not None else spans[-1].context.trace_id
        return format_tree(self.recorder.spans(trace_id), attributes)

    def last_trace_id(self) -> str | None:
        """The latest recorded trace id as 32 hex digits (what trace UIs show)."""
        spans = self.recorder.spans()
        return format(spans[-1].context.trace_id, "032x") if spans else None

    def flush(self, timeout_ms: int = 10_000) -> bool:
        """Export every finished span now (call before the program exits)."""
        return self.tracer_provider.force_flush(timeout_ms)


def connect(
    base_url: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    *,
    timeout_s: float = 120.0,
    max_retries: int = 2,
    service_name: str = "agent",
    otlp_endpoint: str | None = None,
    set_global_provider: bool = True,
    frameworks: bool = True,
    transport: Any = None,
    capture_content: bool | None = None,
) -> Connection:
    """Connect this process's agents to agentserve and return the Connection.

    Defaults (agentserve.sdk.server_env): AGENTSERVE_BASE_URL, else OPENAI_BASE_URL (else
    http://127.0.0.1:8000/v1; /v1 is appended when missing), AGENTSERVE_API_KEY, else
    OPENAI_API_KEY, else the file AGENTSERVE_API_KEY_FILE names (else "none": open mode),
    AGENTSERVE_MODEL (else the bundled model). `timeout_s` bounds each
    model call, `max_retries` retries 429/503 with back-off. Spans go to `otlp_endpoint` or
    OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT when set, and always to the local recorder.
    `set_global_provider` also makes ours OTel's global provider unless one is set.
    `frameworks=False` leaves the agent frameworks alone: only `Connection.client` (e.g. a
    second tenant's client in the same process, passed per run) is configured.
    `transport` replaces the network (tests: an ASGI transport). `capture_content` records
    prompts, completions and tool results on the spans (default: the environment's
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, else off: they may hold user data
    and secrets, and spans go to a shared collector).
    """
    import openai

    base_url = str(resolve_base_url(base_url, os.environ).value)  # agentserve.sdk.server_env
    api_key = resolve_api_key(api_key, None, os.environ).value or "none"
    model = model or os.environ.get("AGENTSERVE_MODEL", DEFAULT_MODEL)
    if capture_content is None:
        capture_content = os.environ.get(CAPTURE_ENV, "").strip().lower() == "true"
    provider, recorder, endpoint = make_sdk_provider(service_name, otlp_endpoint)
    hooks = TraceHeaders()
    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=max_retries,
        timeout=timeout_s,
        http_client=http_client(hooks, timeout_s, transport),
    )
    connection = Connection(base_url, model, client, provider, recorder, endpoint)
    if frameworks and _configure_openai_agents(client, model, provider, hooks, capture_content):
        connection.frameworks.append("openai-agents")
    if frameworks and _configure_pydantic_ai(provider, capture_content):
        connection.frameworks.append("pydantic-ai")
    if set_global_provider and not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(provider)
    return connection


def _configure_openai_agents(
    client: Any, model: str, provider, hooks: TraceHeaders, capture_content: bool
) -> bool:
    """Point the Agents SDK at `client` with our trace processor; False if not installed."""
    try:
        import agents
    except ImportError:
        return False
    from agentserve.sdk.agents_tracing import GenAITraceProcessor  # lazy: imports `agents`

    agents.set_default_openai_client(client, use_for_tracing=False)
    agents.set_default_openai_api("chat_completions")
    os.environ["OPENAI_DEFAULT_MODEL"] = model  # the SDK's own default-model setting
    processor = GenAITraceProcessor(
        provider.get_tracer("agentserve.sdk"), default_model=model, capture_content=capture_content
    )
    agents.set_trace_processors([processor])
    agents.set_tracing_disabled(False)
    hooks.resolvers.insert(0, processor.current_otel_span)
    return True


def _configure_pydantic_ai(provider, capture_content: bool) -> bool:
    """Instrument every Pydantic AI agent with `provider`; False if not installed."""
    try:
        from pydantic_ai import Agent
        from pydantic_ai.models.instrumented import InstrumentationSettings
    except ImportError:
        return False
    settings = InstrumentationSettings(tracer_provider=provider, include_content=capture_content)
    Agent.instrument_all(settings)
    return True

"""Tracing: W3C trace context helpers, OTel GenAI attribute names, and exporter setup.

Configuration (`trace_export`, pure): the spec's `tracing` section and the standard OTEL_*
variables decide one OTLP exporter or none. With none, callers get OTel's no-op tracer:
no spans, no threads, no cost. Spans are exported from a background batch thread with a
short timeout, so a slow or broken collector drops spans and never fails a request.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentserve.spec import TracingSpec

__all__ = [
    "FORWARDED_HEADERS",
    "TraceExport",
    "close_tracer",
    "forwarded_trace_headers",
    "make_tracer",
    "trace_export",
    "valid_traceparent",
]

# -- GenAI semantic conventions (gen_ai.*) and ours (agentserve.*) -------------------------------
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
WORKFLOW_NAME = "gen_ai.workflow.name"
ERROR_TYPE = "error.type"
TENANT = "agentserve.tenant"
# the replica's spans are not GenAI operations (no gen_ai.operation.name): own names for
# what the ingress span records under gen_ai.* (model, finish reasons)
MODEL = "agentserve.model"
ADAPTER = "agentserve.lora.adapter"  # the LoRA adapter a request named (gen_ai.request.model)
SERVED_FINISH_REASONS = "agentserve.finish_reasons"
REQUEST_ID = "agentserve.request_id"
TTFT_S = "agentserve.ttft_s"
CANCELLED = "agentserve.cancelled"  # the client went away before the end
# the replica's own token counts: not gen_ai.usage.*, which the client's `chat` span and the
# ingress span already carry (backends that sum gen_ai.usage per span would count it thrice)
SERVED_INPUT_TOKENS = "agentserve.input_tokens"
SERVED_OUTPUT_TOKENS = "agentserve.output_tokens"
DECODE_STEPS = "agentserve.decode.steps"
DRAFT_TOKENS = "agentserve.spec_decode.draft_tokens"
ACCEPTED_TOKENS = "agentserve.spec_decode.accepted_tokens"
ACCEPTANCE_LENGTH = "agentserve.spec_decode.acceptance_length"
# hybrid drafting, per proposer P (ngram, dflash): agentserve.spec_decode.P.drafts etc.
PROPOSER_PREFIX = "agentserve.spec_decode"
PROVIDER_NAME = "agentserve"

# -- W3C trace context ---------------------------------------------------------------------------
# version-traceid-parentid-flags; all-zero ids and version ff are invalid (W3C Trace Context)
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
FORWARDED_HEADERS = ("traceparent", "tracestate", "baggage")
_W3C = TraceContextTextMapPropagator()


def valid_traceparent(value: str | None) -> bool:
    """True when `value` is a W3C traceparent a receiver must honour."""
    match = _TRACEPARENT.match((value or "").strip())
    if match is None:
        return False
    version, trace_id, parent_id, _ = match.groups()
    return version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16


# W3C limits: baggage at most 8192 bytes and 180 members; tracestate 32 members, and
# receivers may drop it past 512 characters. A header over its bound is not passed on.
HEADER_BOUNDS = {"baggage": (8192, 180), "tracestate": (512, 32)}


def forwarded_trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The trace headers to pass on; a malformed traceparent drops the whole context, a
    baggage or tracestate over its HEADER_BOUNDS is dropped alone."""
    lower = {k.lower(): v for k, v in headers.items()}
    if not valid_traceparent(lower.get("traceparent")):
        return {}
    out = {}
    for name in FORWARDED_HEADERS:
        value = lower.get(name, "").strip()
        size, members = HEADER_BOUNDS.get(name, (None, None))
        if value and (size is None or (len(value) <= size and value.count(",") < members)):
            out[name] = value
    return out


def extract_context(headers: Mapping[str, str]) -> Context:
    """The parent context named by valid W3C headers; an empty context otherwise."""
    return _W3C.extract(forwarded_trace_headers(headers))


def inject_span(span: trace.Span, into: dict[str, str]) -> dict[str, str]:
    """Write `span`'s traceparent (and tracestate) into `into`; nothing for an invalid span."""
    if span.get_span_context().is_valid:
        _W3C.inject(into, context=trace.set_span_in_context(span))
    return into


# -- exporter configuration ------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceExport:
    """Where and how spans go: OTLP `endpoint` (full URL), `protocol`, sampling, service."""

    endpoint: str
    protocol: str = "http/protobuf"
    sample_ratio: float = 1.0
    service_name: str = "agentserve"


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes")


def _traces_url(base: str, protocol: str) -> str:
    """A base OTLP URL -> the traces URL (HTTP appends /v1/traces; gRPC takes the base)."""
    base = base.rstrip("/")
    if protocol == "grpc" or base.endswith("/v1/traces"):
        return base
    return base + "/v1/traces"


def trace_export(spec: TracingSpec, env: Mapping[str, str]) -> TraceExport | None:
    """Decide the exporter (pure). None = tracing off.

    Off when OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is "none". Otherwise the
    endpoint is the spec's `otlp_endpoint` (unless the spec sets `enabled: false`), else
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (full URL), else OTEL_EXPORTER_OTLP_ENDPOINT (base
    URL); no endpoint = off. So the standard variables switch tracing on for any spec
    (`agentserve up --traces` relies on it). OTEL_SERVICE_NAME overrides `service_name`;
    OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL picks "grpc" or "http/protobuf" (default).
    """
    if _env_flag(env, "OTEL_SDK_DISABLED") or env.get("OTEL_TRACES_EXPORTER") == "none":
        return None
    switched_off = spec.enabled is False  # null (the default): on with an endpoint
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    protocol = "grpc" if protocol == "grpc" else "http/protobuf"
    if spec.otlp_endpoint and not switched_off:
        endpoint = _traces_url(spec.otlp_endpoint, protocol)
    elif env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        endpoint = env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = _traces_url(env["OTEL_EXPORTER_OTLP_ENDPOINT"], protocol)
    else:
        return None
    service = env.get("OTEL_SERVICE_NAME") or spec.service_name
    return TraceExport(endpoint, protocol, spec.sample_ratio, service)


# -- providers ----------------------------------------------------------------------------------
EXPORT_TIMEOUT_S = 3.0
SCHEDULE_DELAY_MS = 1000


def make_provider(
    export: TraceExport,
    exporter=None,
    *,
    component: str | None = None,
    trust_remote_parent: bool = True,
):
    """An SDK TracerProvider for `export`: ratio sampling, batch export.

    `trust_remote_parent` False (the ingress: its callers are clients): the trace id
    ratio decides even under a remote parent, so a client's traceparent flags can neither
    force nor suppress sampling; True (replicas, whose parent is the ingress): parent-based.
    `exporter` replaces the OTLP exporter (tests pass an in-memory one; it is then
    processed synchronously). Never sets the global provider.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    attributes = {"service.name": export.service_name}
    if component:
        attributes["agentserve.component"] = component
    provider = TracerProvider(
        resource=Resource.create(attributes),
        sampler=_sampler(export.sample_ratio, trust_remote_parent),
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(
            BatchSpanProcessor(_otlp_exporter(export), schedule_delay_millis=SCHEDULE_DELAY_MS)
        )
    return provider


def _sampler(ratio: float, trust_remote_parent: bool):
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    by_ratio = TraceIdRatioBased(ratio)
    if trust_remote_parent:
        return ParentBased(by_ratio)
    return ParentBased(by_ratio, remote_parent_sampled=by_ratio, remote_parent_not_sampled=by_ratio)


def _otlp_exporter(export: TraceExport):
    if export.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=export.endpoint, timeout=EXPORT_TIMEOUT_S)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=export.endpoint, timeout=EXPORT_TIMEOUT_S)


def make_tracer(spec: TracingSpec, env: Mapping[str, str], component: str, exporter=None) -> Tracer:
    """A tracer for one server component ("ingress", "replica"); no-op when tracing is off."""
    if spec.enabled is False and spec.otlp_endpoint:
        logging.getLogger(__name__).warning(
            "tracing.enabled is false: tracing.otlp_endpoint %s is not used (remove enabled, "
            "or set it true, to export there)",
            spec.otlp_endpoint,
        )
    export = trace_export(spec, env)
    if export is None and exporter is None:
        return trace.NoOpTracer()
    export = export or TraceExport("memory", sample_ratio=spec.sample_ratio)
    trust = component != "ingress"  # the ingress's callers are clients
    provider = make_provider(export, exporter, component=component, trust_remote_parent=trust)
    tracer = provider.get_tracer("agentserve")
    _PROVIDERS[id(tracer)] = provider
    return tracer


_PROVIDERS: dict[int, Any] = {}  # id(tracer) -> its TracerProvider (make_tracer)


def close_tracer(tracer: Tracer, timeout_ms: int = 2_000) -> None:
    """Export what `tracer`'s provider still holds (at most `timeout_ms`: a hung collector
    costs spans, not a stuck shutdown), then shut it down; a no-op for a no-op tracer.
    Blocking: a server component calls it from a thread as it stops (its last spans would
    otherwise depend on the process's atexit running)."""
    provider = _PROVIDERS.pop(id(tracer), None)
    if provider is None:
        return
    provider.force_flush(timeout_ms)
    provider.shutdown()

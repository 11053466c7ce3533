"""Server-side spans of one request: ingress (SERVER), queue wait, replica, prefill, decode.

The ingress continues the caller's `traceparent` and hands its own span on in the engine
request's headers, with the wall-clock time it sent the request (`SENT_AT_HEADER`); the
replica side (`traced_stream`) records the queue wait from that time to its start, then
a replica span with prefill (start -> first token) and decode (first token -> end)
children. Decode carries per-request speculation figures counted from the deltas: one
delta per engine step, so steps = deltas that added tokens, accepted = tokens - steps,
acceptance length = tokens / steps, drafted = steps x num_speculative_tokens. With hybrid
drafting the engine also reports the request's drafts per proposer (`proposer_counts`),
known only after its last step was reported: the decode span then ends (at the request's
end time) once they are in, up to a second after the request.

With a no-op tracer every function here still works and records nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from agentserve import tracing as t
from agentserve.engine.delta_tracker import DeltaTracker
from agentserve.engine.protocol import Delta, EngineRequest, aclose_stream

if TYPE_CHECKING:
    from agentserve.api.ask import Ask
    from agentserve.spec import ModelSpec

__all__ = ["SENT_AT_HEADER", "end_ingress", "start_ingress", "trace_headers", "traced_stream"]

ProposerCounts = Callable[[str], Awaitable[Mapping[str, Mapping[str, int]] | None]]
_LATE: set[asyncio.Task] = set()  # decode spans waiting for their per-proposer counts

SENT_AT_HEADER = "x-agentserve-sent-at-ns"
SESSION_HEADER = "x-session-id"
TENANT_HEADER = "x-agentserve-tenant"  # the tenant the ingress resolved, for the replica


_OPERATIONS = {"chat": "chat", "completion": "text_completion", "embeddings": "embeddings"}


def start_ingress(tracer: Tracer, kind: str, headers: Mapping[str, str]) -> Span:
    """Start the ingress span as a child of the caller's valid traceparent (else a root)."""
    parent = t.extract_context(headers)
    span = tracer.start_span("ingress", context=parent, kind=SpanKind.SERVER)
    if span.is_recording():
        span.set_attribute(t.OPERATION, _OPERATIONS.get(kind, kind))
        span.set_attribute(t.PROVIDER, t.PROVIDER_NAME)
        session = {k.lower(): v for k, v in headers.items()}.get(SESSION_HEADER)
        if session:
            span.set_attribute(t.CONVERSATION_ID, session)
    return span


def name_request(span: Span, request_id: str, model: str, ask: Ask | None = None) -> None:
    """The engine request id (the replica's spans carry it too), the model and the GenAI
    request parameters the client set (`ask`: the request, api/ask.py), on the ingress span
    as soon as they are known."""
    if span.is_recording():
        span.set_attributes({t.REQUEST_ID: request_id, t.REQUEST_MODEL: model})
        if ask is not None:
            span.set_attributes(request_attributes(ask))


def request_attributes(ask: Ask) -> dict[str, object]:
    """gen_ai.request.* of a chat or text completion request: the parameters the client
    set (`ask.params`), not the defaults."""
    get, stop = ask.params.get, ask.params.get("stop")
    found = {
        "gen_ai.request.max_tokens": get("max_tokens"),
        "gen_ai.request.temperature": get("temperature"),
        "gen_ai.request.top_p": get("top_p"),
        "gen_ai.request.seed": get("seed"),
        "gen_ai.request.frequency_penalty": get("frequency_penalty"),
        "gen_ai.request.presence_penalty": get("presence_penalty"),
        "gen_ai.request.stop_sequences": [stop] if isinstance(stop, str) else stop or None,
        "gen_ai.request.choice.count": ask.choices if ask.choices != 1 else None,  # prompts x n
    }
    return {k: v for k, v in found.items() if v is not None}


def trace_headers(span: Span, incoming: Mapping[str, str], now_ns: int | None = None) -> dict:
    """Trace headers for the engine request: the ingress span as parent when it is valid,
    else the caller's headers unchanged; plus the send time for the queue-wait span."""
    passed = t.forwarded_trace_headers(incoming)
    if span.get_span_context().is_valid:
        own = t.inject_span(span, {})
        if "baggage" in passed:
            own["baggage"] = passed["baggage"]
        passed = own
    passed[SENT_AT_HEADER] = str(now_ns if now_ns is not None else time.time_ns())
    return passed


def end_ingress(
    span: Span,
    status: int,
    *,
    model: str | None = None,
    adapter: str | None = None,
    tenant: str | None = None,
    request_id: str | None = None,
    ttft_s: float | None = None,
    prompt_tokens: int = 0,
    output_tokens: int = 0,
    finish_reasons: Sequence[str] = (),
) -> None:
    """Record the outcome on the ingress span and end it. An error status for >= 500 only:
    on a SERVER span a 4xx is the client's (OTel's HTTP conventions leave it unset), so
    401s, 429s and clients going away (499) do not raise the service's error rate.
    `adapter`: the LoRA adapter the request named, its gen_ai.request.model (as vLLM
    names the model it served), with `model` as agentserve.model."""
    if span.is_recording():
        attributes = {
            "http.response.status_code": status,
            t.REQUEST_MODEL: adapter or model,
            t.ADAPTER: adapter,
            t.MODEL: model if adapter else None,
            t.TENANT: tenant,
            t.REQUEST_ID: request_id,
            t.TTFT_S: ttft_s,
            t.INPUT_TOKENS: prompt_tokens,
            t.OUTPUT_TOKENS: output_tokens,
        }
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if finish_reasons:  # one per choice, in choice order
            span.set_attribute(t.FINISH_REASONS, list(finish_reasons))
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            span.set_attribute(t.ERROR_TYPE, str(status))  # GenAI: required on an error
    span.end()


def speculative_tokens(engine: object, model: ModelSpec | None = None) -> int:
    """Tokens drafted per step by `engine` serving `model` (a ModelSpec; default the
    engine's own `spec`, as VLLMEngine keeps it): the drafter's `num_speculative_tokens`
    when the drafter is enabled, else the engine's own `num_speculative_tokens` (the fake
    engine's), else 0. The one reading of it, for Ray replicas and LocalBackend alike."""
    model = model if model is not None else getattr(engine, "spec", None)
    if model is not None and model.drafter.enabled:
        return model.drafter.num_speculative_tokens
    return int(getattr(engine, "num_speculative_tokens", 0) or 0)


def speculation_attributes(steps: int, tokens: int, num_speculative_tokens: int) -> dict:
    """Per-request speculation figures (pure); see the module docstring."""
    if steps <= 0:
        return {t.DECODE_STEPS: 0}
    return {
        t.DECODE_STEPS: steps,
        t.DRAFT_TOKENS: steps * num_speculative_tokens if num_speculative_tokens else 0,
        t.ACCEPTED_TOKENS: max(0, tokens - steps) if num_speculative_tokens else 0,
        t.ACCEPTANCE_LENGTH: tokens / steps,
    }


async def traced_stream(
    tracer: Tracer,
    request: EngineRequest,
    stream: AsyncIterator[Delta],
    *,
    model: str,
    num_speculative_tokens: int = 0,
    proposer_counts: ProposerCounts | None = None,
) -> AsyncIterator[Delta]:
    """Yield `stream`'s deltas unchanged, recording queue wait, replica, prefill, decode.

    Closing this generator closes `stream` (so the engine aborts the request).
    """
    parent = t.extract_context(request.headers)
    start_ns = time.time_ns()
    _queue_wait(tracer, parent, request.headers.get(SENT_AT_HEADER), start_ns, model)
    replica = tracer.start_span("replica", context=parent, start_time=start_ns)
    if replica.is_recording():
        replica.set_attribute(t.REQUEST_ID, request.request_id)
    progress = DeltaTracker()  # times in ns
    try:
        async for delta in stream:
            if progress.see(delta, time.time_ns()) and replica.is_recording():
                inside = trace.set_span_in_context(replica)
                _span(tracer, "prefill", inside, start_ns, int(progress.first), model)
            yield delta
    except (asyncio.CancelledError, GeneratorExit):  # the client went away: not an error
        if replica.is_recording():
            replica.set_attribute(t.CANCELLED, True)
        raise
    except BaseException as err:
        if replica.is_recording():
            replica.record_exception(err)
            replica.set_status(Status(StatusCode.ERROR, type(err).__name__))
            replica.set_attribute(t.ERROR_TYPE, type(err).__qualname__)
        raise
    finally:
        await aclose_stream(stream)
        if replica.is_recording():
            late = (lambda: proposer_counts(request.request_id)) if proposer_counts else None
            _end_replica(tracer, replica, progress, model, num_speculative_tokens, late)


def _end_replica(
    tracer: Tracer,
    replica: Span,
    progress: DeltaTracker,
    model: str,
    num_speculative_tokens: int,
    late: Callable[[], Awaitable[Mapping[str, Mapping[str, int]] | None]] | None = None,
) -> None:
    """End the decode child (first token -> now) and the replica span with token figures;
    with `late`, the decode child once the per-proposer counts are in."""
    end_ns = time.time_ns()
    tokens, steps = progress.completion_tokens, progress.steps
    if progress.first is not None:
        inside = trace.set_span_in_context(replica)
        decode = _span(tracer, "decode", inside, int(progress.first), None, model)
        decode.set_attributes(speculation_attributes(steps, tokens, num_speculative_tokens))
        decode.set_attribute(t.SERVED_OUTPUT_TOKENS, tokens)
        if late is None:
            decode.end(end_time=end_ns)
        else:
            task = asyncio.get_running_loop().create_task(_end_late(decode, end_ns, late))
            _LATE.add(task)
            task.add_done_callback(_LATE.discard)
    replica.set_attributes(
        {
            t.MODEL: model,
            t.SERVED_INPUT_TOKENS: progress.prompt_tokens,
            t.SERVED_OUTPUT_TOKENS: tokens,
        }
    )
    if progress.finish_reason:
        replica.set_attribute(t.SERVED_FINISH_REASONS, [progress.finish_reason])
    replica.end(end_time=end_ns)


def proposer_attributes(counts: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """agentserve.spec_decode.<proposer>.{drafts,draft_tokens,accepted_tokens} (pure)."""
    out = {}
    for proposer, c in sorted(counts.items()):
        prefix = f"{t.PROPOSER_PREFIX}.{proposer}"
        out[f"{prefix}.drafts"] = int(c.get("drafts", 0))
        out[f"{prefix}.draft_tokens"] = int(c.get("drafted_tokens", 0))
        out[f"{prefix}.accepted_tokens"] = int(c.get("accepted_tokens", 0))
    return out


async def _end_late(
    decode: Span, end_ns: int, late: Callable[[], Awaitable[Mapping | None]]
) -> None:
    try:
        counts = await late()
        if counts:
            decode.set_attributes(proposer_attributes(counts))
    except Exception:  # a report: the span ends without the counts
        pass
    finally:
        decode.end(end_time=end_ns)


def _queue_wait(tracer: Tracer, parent, sent_at: str | None, start_ns: int, model: str) -> None:
    """The span from the ingress sending the request to the replica starting it."""
    try:
        sent_ns = int(sent_at) if sent_at else None
    except ValueError:
        sent_ns = None
    if sent_ns is not None and sent_ns <= start_ns:
        _span(tracer, "queue_wait", parent, sent_ns, start_ns, model)


def _span(tracer: Tracer, name: str, parent, start_ns: int, end_ns: int | None, model: str) -> Span:
    """A child span of `parent` from start_ns; ended at end_ns unless that is None."""
    span = tracer.start_span(name, context=parent, start_time=start_ns)
    span.set_attribute(t.MODEL, model)
    if end_ns is not None:
        span.end(end_time=end_ns)
    return span

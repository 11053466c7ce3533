"""agentserve.sdk's request hooks and conversation id, without a server: which span and
session go out, what a chat completion body records on the span."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from agentserve import tracing as t
from agentserve.sdk.context import conversation, current_conversation_id
from agentserve.sdk.transport import TraceHeaders, record_response
from opentelemetry import baggage, context
from opentelemetry.sdk.trace import TracerProvider


@pytest.fixture
def tracer():
    return TracerProvider().get_tracer("test")


def _request(**headers):
    return httpx2.Request("POST", "http://x/v1/chat/completions", headers=headers)


def test_conversation_precedence():
    assert current_conversation_id() is None
    token = context.attach(baggage.set_baggage("gen_ai.conversation.id", "from-baggage"))
    try:
        assert current_conversation_id() == "from-baggage"
        with conversation("explicit"):
            assert current_conversation_id() == "explicit"
    finally:
        context.detach(token)
    with pytest.raises(ValueError), conversation(""):
        pass


def test_request_hook_sets_traceparent_of_the_resolved_span_and_session(tracer):
    span = tracer.start_span("chat m")
    hooks = TraceHeaders([lambda: span])
    request = _request(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    with conversation("c-1"):
        asyncio.run(hooks.on_request(request))
    sent = request.headers["traceparent"].split("-")
    assert sent[1] == format(span.get_span_context().trace_id, "032x")
    assert sent[2] == format(span.get_span_context().span_id, "016x")
    assert request.headers["x-session-id"] == "c-1"


def test_callers_session_header_wins_and_no_span_sends_no_traceparent():
    request = _request(**{"x-session-id": "mine"})
    with conversation("other"):
        asyncio.run(TraceHeaders([lambda: None]).on_request(request))
    assert request.headers["x-session-id"] == "mine" and "traceparent" not in request.headers


def test_record_response_copies_finish_reasons_usage_and_ids(tracer):
    span = tracer.start_span("chat m")
    body = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    record_response(span, body)
    a = span.attributes
    assert a[t.FINISH_REASONS] == ("tool_calls",) and a[t.RESPONSE_ID] == "chatcmpl-1"
    assert (a[t.INPUT_TOKENS], a[t.OUTPUT_TOKENS], a[t.RESPONSE_MODEL]) == (7, 3, "m")

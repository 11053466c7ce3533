"""Tracing: exporter configuration table, server spans joining the caller's trace (ingress ->
queue wait -> replica -> prefill/decode with speculation figures), off = no spans, and a
broken or hanging collector never failing or slowing a request."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from agentserve import tracing as t
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.serve.spans import speculation_attributes, speculative_tokens
from agentserve.spec import DeploymentSpec, ModelSpec, TracingSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

LOCAL = "http://localhost"  # open mode answers only trusted Host names

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"
MSG = [{"role": "user", "content": "one two three four five"}]


@pytest.mark.parametrize(
    ("spec", "env", "want"),
    [
        ({}, {}, None),
        ({"enabled": True}, {}, None),  # on, but nowhere to send
        ({"otlp_endpoint": "http://c:4318"}, {}, ("http://c:4318/v1/traces", "http/protobuf")),
        ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318/"}, ("http://e:4318/v1/traces", None)),
        ({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://e:9/x"}, ("http://e:9/x", None)),
        (
            {},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ("http://e:4317", "grpc"),
        ),
        # an explicit `enabled: false` (as in a dumped spec) silences the spec's endpoint only
        ({"enabled": False, "otlp_endpoint": "http://c:4318"}, {}, None),
        (
            {"enabled": False, "otlp_endpoint": "http://c:4318"},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318"},
            ("http://e:4318/v1/traces", None),
        ),
        ({"otlp_endpoint": "http://c:4318"}, {"OTEL_SDK_DISABLED": "true"}, None),
        ({"otlp_endpoint": "http://c:4318"}, {"OTEL_TRACES_EXPORTER": "none"}, None),
    ],
)
def test_trace_export_table(spec, env, want):
    got = t.trace_export(TracingSpec(**spec), env)
    if want is None:
        assert got is None
        return
    assert got.endpoint == want[0]
    assert got.protocol == (want[1] or "http/protobuf")


def test_service_name_from_env_and_off_means_noop_tracer():
    export = t.trace_export(
        TracingSpec(otlp_endpoint="http://c:4318", service_name="a"), {"OTEL_SERVICE_NAME": "b"}
    )
    assert export.service_name == "b"
    tracer = t.make_tracer(TracingSpec(), {}, "ingress")
    assert isinstance(tracer, trace.NoOpTracer)
    assert not tracer.start_span("x").is_recording()


@pytest.mark.parametrize(
    ("steps", "tokens", "k", "want"),
    [
        (0, 0, 4, {t.DECODE_STEPS: 0}),
        (5, 10, 4, (5, 20, 5, 2.0)),
        (4, 4, 0, (4, 0, 0, 1.0)),  # no drafter: one token per step
    ],
)
def test_speculation_attributes(steps, tokens, k, want):
    got = speculation_attributes(steps, tokens, k)
    if isinstance(want, dict):
        assert got == want
        return
    keys = (t.DECODE_STEPS, t.DRAFT_TOKENS, t.ACCEPTED_TOKENS, t.ACCEPTANCE_LENGTH)
    assert tuple(got[k] for k in keys) == want


def test_speculative_tokens_one_reading_for_replicas_and_local_backends():
    """The drafter's k when it drafts (the model given, or the engine's own spec), else the
    engine's own k (the fake's), else 0."""
    drafting = ModelSpec(source="/m", drafter={"enabled": True, "method": "ngram"})
    plain = ModelSpec(source="/m", drafter={"enabled": False})
    fake = FakeEngine("m", 64, num_speculative_tokens=3)
    k = drafting.drafter.num_speculative_tokens
    assert speculative_tokens(SimpleNamespace(spec=drafting)) == k  # LocalBackend(VLLMEngine)
    assert speculative_tokens(fake, drafting) == k  # a replica: its model spec wins
    assert speculative_tokens(fake) == 3 == speculative_tokens(fake, plain)
    assert speculative_tokens(SimpleNamespace(spec=plain)) == 0


def _spec(tenants=()):
    return DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 128}],
            "tenants": list(tenants),
        }
    )


def _traced_client(spec=None):
    exporter = InMemorySpanExporter()
    tracer = t.make_tracer(TracingSpec(), {}, "test", exporter=exporter)
    engine = FakeEngine("m", 128)
    asyncio.run(engine.start())
    app = create_app(spec or _spec(), {"m": LocalBackend(engine, tracer)}, tracer=tracer)
    return TestClient(app, base_url=LOCAL), engine, exporter


def _by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


@pytest.mark.parametrize("stream", [False, True])
def test_server_spans_continue_the_callers_trace(stream):
    client, engine, exporter = _traced_client()
    r = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MSG, "stream": stream},
        headers={"traceparent": TRACEPARENT, "x-session-id": "conv-1"},
    )
    assert r.status_code == 200
    spans = _by_name(exporter)
    assert set(spans) == {"ingress", "queue_wait", "replica", "prefill", "decode"}
    assert {format(s.context.trace_id, "032x") for s in spans.values()} == {TRACE_ID}
    ingress = spans["ingress"]
    assert format(ingress.parent.span_id, "016x") == PARENT
    assert ingress.kind == trace.SpanKind.SERVER
    for child in ("queue_wait", "replica"):
        assert spans[child].parent.span_id == ingress.context.span_id
    for child in ("prefill", "decode"):
        assert spans[child].parent.span_id == spans["replica"].context.span_id
    a = ingress.attributes
    assert a[t.CONVERSATION_ID] == "conv-1" and a[t.REQUEST_MODEL] == "m"
    assert a[t.INPUT_TOKENS] == 6 and a[t.OUTPUT_TOKENS] == 6
    assert a[t.FINISH_REASONS] == ("stop",) and a["http.response.status_code"] == 200
    assert not [k for k in a if k.startswith("gen_ai.request.") and k != t.REQUEST_MODEL]

    # usage as gen_ai.usage.* on the ingress only: the replica's spans count under their own
    # names (a backend summing gen_ai.usage per span would count the request thrice)
    for child in ("replica", "decode"):
        assert not [k for k in spans[child].attributes if k.startswith("gen_ai.usage")]
    # nor any gen_ai.* at all: they are not GenAI operations (which require one)
    for child in ("queue_wait", "replica", "prefill", "decode"):
        assert not [k for k in spans[child].attributes if k.startswith("gen_ai.")]
        assert spans[child].attributes[t.MODEL] == "m"
    assert spans["replica"].attributes[t.SERVED_FINISH_REASONS] == ("stop",)
    assert spans["replica"].attributes[t.SERVED_OUTPUT_TOKENS] == 6
    decode = spans["decode"].attributes  # fake: 2 tokens per step, 4 drafted per step
    assert decode[t.DECODE_STEPS] == 3 and decode[t.ACCEPTANCE_LENGTH] == 2.0
    assert decode[t.ACCEPTED_TOKENS] == 3 and decode[t.DRAFT_TOKENS] == 12
    # the engine got the ingress span as its parent, not the caller's span
    (request,) = engine.requests
    assert request.headers["traceparent"].split("-")[2] == format(ingress.context.span_id, "016x")


def test_ingress_span_records_the_request_parameters_the_client_set():
    client, _, exporter = _traced_client()
    body = {"model": "m", "messages": MSG, "max_completion_tokens": 5, "temperature": 0.5,
            "top_p": 0.9, "seed": 7, "stop": "END", "n": 2, "presence_penalty": 0.0}  # fmt: skip
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    a = _by_name(exporter)["ingress"].attributes
    assert a["gen_ai.request.max_tokens"] == 5 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.top_p"] == 0.9 and a["gen_ai.request.seed"] == 7
    assert a["gen_ai.request.stop_sequences"] == ("END",)
    assert a["gen_ai.request.choice.count"] == 2
    assert a[t.FINISH_REASONS] == ("length", "length")  # one per choice (max 5 tokens)
    assert a["gen_ai.request.presence_penalty"] == 0.0  # set, though to the default
    assert "gen_ai.request.frequency_penalty" not in a  # not set


def test_rejected_request_ends_ingress_span_with_its_status_but_no_error():
    """A 4xx is the client's: on a SERVER span OTel's HTTP conventions leave the status
    unset, so rejected keys do not count as the service's errors."""
    spec = _spec([{"name": "a", "api_key_sha256": hash_api_key("sk-a"), "sla": {}}])
    client, _, exporter = _traced_client(spec)
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
    assert r.status_code == 401
    (span,) = exporter.get_finished_spans()
    assert span.name == "ingress" and span.status.status_code == trace.StatusCode.UNSET
    assert span.attributes["http.response.status_code"] == 401
    assert t.ERROR_TYPE not in span.attributes


def test_ingress_span_is_an_error_for_a_5xx_and_a_client_leaving_is_not():
    from agentserve.serve.spans import end_ingress, traced_stream

    exporter = InMemorySpanExporter()
    tracer = t.make_tracer(TracingSpec(), {}, "test", exporter=exporter)
    end_ingress(tracer.start_span("ingress"), 503)
    engine = FakeEngine("m", 128)

    async def leave_after_one_delta():
        await engine.start()
        from agentserve.engine.protocol import EngineRequest
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        request = EngineRequest("req-1", "chat", ChatCompletionRequest(model="m", messages=MSG))
        stream = traced_stream(tracer, request, engine.generate(request), model="m")
        await anext(stream)
        await stream.aclose()  # the client went away

    asyncio.run(leave_after_one_delta())
    spans = _by_name(exporter)
    assert spans["ingress"].status.status_code == trace.StatusCode.ERROR
    assert spans["ingress"].attributes[t.ERROR_TYPE] == "503"  # GenAI: required on errors
    replica = spans["replica"]
    assert replica.status.status_code == trace.StatusCode.UNSET
    assert replica.attributes[t.CANCELLED] is True
    assert t.ERROR_TYPE not in replica.attributes

    async def engine_fails():
        from agentserve.engine.protocol import EngineRequest
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        async def broken():
            raise ConnectionResetError("engine core died")
            yield  # an async generator

        request = EngineRequest("req-2", "chat", ChatCompletionRequest(model="m", messages=MSG))
        with contextlib.suppress(ConnectionResetError):
            async for _ in traced_stream(tracer, request, broken(), model="m"):
                pass

    exporter.clear()
    asyncio.run(engine_fails())
    failed = _by_name(exporter)["replica"]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.attributes[t.ERROR_TYPE] == "ConnectionResetError"


def test_untraced_ingress_passes_the_callers_headers_on():
    engine = FakeEngine("m", 128)
    asyncio.run(engine.start())
    client = TestClient(create_app(_spec(), {"m": LocalBackend(engine)}), base_url=LOCAL)
    headers = {"traceparent": TRACEPARENT, "tracestate": "k=v", "baggage": "b=1"}
    assert client.post(
        "/v1/chat/completions", json={"model": "m", "messages": MSG}, headers=headers
    ).is_success
    got = engine.requests[0].headers
    assert {k: got[k] for k in headers} == headers


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Blackhole:
    """A TCP server that accepts and never answers (a hung collector)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return


@pytest.mark.parametrize("collector", ["refused", "hanging"])
def test_broken_collector_never_fails_or_slows_requests(collector):
    port = _closed_port() if collector == "refused" else _Blackhole().port
    tracer = t.make_tracer(TracingSpec(otlp_endpoint=f"http://127.0.0.1:{port}"), {}, "ingress")
    assert tracer.start_span("probe").is_recording()
    engine = FakeEngine("m", 128)
    asyncio.run(engine.start())
    app = create_app(_spec(), {"m": LocalBackend(engine, tracer)}, tracer=tracer)
    client = TestClient(app, base_url=LOCAL)
    started = time.monotonic()
    for i in range(30):
        body = {"model": "m", "messages": MSG, "stream": i % 2 == 0}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        time.sleep(0.05)  # let the batch exporter try (and fail) meanwhile
    assert time.monotonic() - started < 10


def test_decode_span_carries_the_requests_counts_per_proposer_once_reported():
    """Hybrid drafting: the engine reports a request's drafts per proposer after its last
    step; the decode span waits for them and still ends at the request's end."""
    from agentserve.engine.protocol import EngineRequest
    from agentserve.serve.spans import traced_stream

    exporter = InMemorySpanExporter()
    tracer = t.make_tracer(TracingSpec(), {}, "test", exporter=exporter)
    engine = FakeEngine("m", 128)
    asked = []

    async def proposer_counts(request_id):
        asked.append(request_id)
        await asyncio.sleep(0.2)  # the engine writes its counts a little after the end
        return {"ngram": {"drafts": 2, "drafted_tokens": 8, "accepted_tokens": 5},
                "dflash": {"drafts": 1, "drafted_tokens": 3, "accepted_tokens": 1}}  # fmt: skip

    async def run():
        await engine.start()
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        body = ChatCompletionRequest(model="m", messages=MSG)
        request = EngineRequest("req-1", "chat", body)
        stream = traced_stream(
            tracer, request, engine.generate(request), model="m", proposer_counts=proposer_counts
        )
        async for _ in stream:
            pass
        ended = time.time_ns()
        assert "decode" not in _by_name(exporter)  # waiting for the counts
        await asyncio.sleep(0.5)
        return ended

    ended = asyncio.run(run())
    spans = _by_name(exporter)
    assert asked == ["req-1"]
    decode = spans["decode"]
    assert decode.end_time <= ended  # the request's end, not the report's
    a = decode.attributes
    assert a["agentserve.spec_decode.ngram.drafts"] == 2
    assert a["agentserve.spec_decode.ngram.draft_tokens"] == 8
    assert a["agentserve.spec_decode.ngram.accepted_tokens"] == 5
    assert a["agentserve.spec_decode.dflash.accepted_tokens"] == 1


def test_ingress_span_names_the_engine_request_the_replica_spans_carry():
    client, engine, exporter = _traced_client()
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
    assert r.status_code == 200
    spans = _by_name(exporter)
    request_id = spans["ingress"].attributes[t.REQUEST_ID]
    assert request_id == engine.requests[0].request_id
    assert spans["ingress"].attributes[t.REQUEST_MODEL] == "m"


def test_close_tracer_exports_what_is_held_and_bounds_the_wait():
    """A server component's tracer is closed as it stops: the spans its batch processor
    still holds are exported then (not left to atexit), within the timeout."""
    exporter = InMemorySpanExporter()
    tracer = t.make_tracer(TracingSpec(), {}, "replica", exporter=exporter)
    tracer.start_span("last").end()
    t.close_tracer(tracer)
    assert [s.name for s in exporter.get_finished_spans()] == ["last"]
    assert id(tracer) not in t._PROVIDERS
    t.close_tracer(tracer)  # twice, and a no-op tracer: nothing to do
    t.close_tracer(t.make_tracer(TracingSpec(), {}, "replica"))


def test_the_specs_endpoint_survives_the_defaults_up_and_the_operator_apply():
    """`agentserve up` and the operator rebuild the spec from a dump (spec_defaults,
    spec_overrides): an endpoint set alone used to lose to the dumped default `enabled:
    false`, so a spec's tracing.otlp_endpoint exported nothing (found by review)."""
    from agentserve.spec import DeploymentSpec
    from agentserve.spec.defaults import with_default_drafters
    from agentserve.spec.overrides import with_overrides

    spec = DeploymentSpec.model_validate({"tracing": {"otlp_endpoint": "http://c:4318"}})
    rebuilt, _ = with_default_drafters(spec, None, lambda source: None)
    rebuilt = with_overrides(rebuilt, "127.0.0.1", 8001)
    export = t.trace_export(rebuilt.tracing, {})
    assert export is not None and export.endpoint == "http://c:4318/v1/traces"
    tracing = {"enabled": False, "otlp_endpoint": "http://c:4318"}
    off = DeploymentSpec.model_validate({"tracing": tracing})
    assert t.trace_export(DeploymentSpec.model_validate(off.model_dump()).tracing, {}) is None


def test_an_endpoint_silenced_by_enabled_false_is_said(caplog):
    import logging

    spec = TracingSpec(enabled=False, otlp_endpoint="http://c:4318")
    with caplog.at_level(logging.WARNING, logger="agentserve.tracing"):
        tracer = t.make_tracer(spec, {}, "ingress")
    assert "not used" in caplog.text and "http://c:4318" in caplog.text
    assert not tracer.start_span("x").is_recording()

"""Issue 16 items 10-12: engine-steering fields refused at the ingress, prompt logprobs
refused rather than silently dropped (output logprobs are served: issue 15); a client's
trace flags cannot force sampling and oversized baggage is not passed on; vLLM fetches no
remote media by default."""

from __future__ import annotations

import asyncio

import pytest
from agentserve import tracing as t
from agentserve.api.errors import InvalidRequestError
from agentserve.api.openai import parse_request
from agentserve.serve import spans
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, TracingSpec
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # sampled flag set


@pytest.mark.parametrize(
    ("kind", "extra", "param"),
    [
        ("chat", {"chat_template": "{{ 'pwned' }}"}, "chat_template"),
        ("chat", {"priority": -100}, "priority"),
        ("completion", {"priority": 5}, "priority"),
        ("chat", {"prompt_logprobs": 1000}, "prompt_logprobs"),
        ("completion", {"prompt_logprobs": 1}, "prompt_logprobs"),
        ("chat", {"logprobs": True, "logprob_token_ids": [1, 2]}, "logprob_token_ids"),
        ("completion", {"logprobs": 1, "echo": True}, "echo"),
    ],
)
def test_engine_steering_and_prompt_logprob_fields_are_400(kind, extra, param):
    base = CHAT if kind == "chat" else COMPLETION
    with pytest.raises(InvalidRequestError) as err:
        parse_request(kind, {**base, **extra})
    assert (err.value.param, err.value.code) == (param, "unsupported_parameter")


@pytest.mark.parametrize(
    "extra",
    [
        {"priority": 0},
        {"logprobs": False},
        {"top_logprobs": 0},
        {"chat_template": None},
        {"logprobs": True, "top_logprobs": 20},  # output log probabilities are served
    ],
)
def test_defaults_of_those_fields_pass(extra):
    parse_request("chat", {**CHAT, **extra})


def test_a_refused_request_never_reaches_the_engine():
    engine = FakeEngine("m", 64)
    asyncio.run(engine.start())
    spec = DeploymentSpec.model_validate({"models": [{"name": "m", "engine": "fake"}]})
    app = create_app(spec, {"m": LocalBackend(engine)})
    client = TestClient(
        app, base_url="http://127.0.0.1", raise_server_exceptions=False, client=("127.0.0.1", 5000)
    )
    r = client.post("/v1/chat/completions", json={**CHAT, "chat_template": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
    assert not engine.requests


def _recording(component, flags, ratio=0.0):
    tracer = t.make_tracer(
        TracingSpec(sample_ratio=ratio), {}, component, exporter=InMemorySpanExporter()
    )
    span = spans.start_ingress(tracer, "chat", {"traceparent": TP[:-2] + flags})
    span.end()
    return span.is_recording() or span.get_span_context().trace_flags.sampled


def test_a_clients_sampled_flag_cannot_force_sampling_at_the_ingress():
    assert not _recording("ingress", "01")  # ratio 0: never, whatever the client says
    assert _recording("ingress", "00", ratio=1.0)  # nor can it suppress sampling
    assert _recording("replica", "01")  # replicas follow their parent, the ingress


def test_oversized_baggage_and_tracestate_are_not_forwarded():
    ok = {"traceparent": TP, "baggage": "a=1,b=2", "tracestate": "v=1"}
    assert t.forwarded_trace_headers(ok) == ok
    big = {
        "traceparent": TP,
        "baggage": "k=" + "x" * 9000,
        "tracestate": ",".join(f"v{i}=1" for i in range(40)),
    }
    assert t.forwarded_trace_headers(big) == {"traceparent": TP}
    many = {"traceparent": TP, "baggage": ",".join(f"k{i}=1" for i in range(181))}
    assert "baggage" not in t.forwarded_trace_headers(many)


def test_vllm_fetches_no_remote_media_by_default():
    pytest.importorskip("vllm")
    from agentserve.engine.vllm_args import engine_kwargs
    from agentserve.spec import ModelSpec
    from vllm.multimodal.media.connector import MediaConnector

    kwargs = engine_kwargs(ModelSpec(), "/models/x")
    connector = MediaConnector(allowed_media_domains=kwargs["allowed_media_domains"])
    with pytest.raises(ValueError, match="allowed domains"):
        connector.load_from_url("http://169.254.169.254/latest/meta-data", None, fetch_timeout=1)
    listed = ModelSpec(engine_args={"allowed_media_domains": ["images.example.com"]})
    assert engine_kwargs(listed, "/m")["allowed_media_domains"] == ["images.example.com"]

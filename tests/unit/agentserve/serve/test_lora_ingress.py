"""LoRA adapters through the ingress over a fake engine (no Ray): a request's model names an
adapter (its name or model:adapter), the engine body names it, the answer echoes it;
unknown adapters 404; /v1/models lists adapters with their parent; metrics, spans and
the affinity key carry the adapter."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.serve.affinity import AFFINITY_HEADER
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def _spec():
    return DeploymentSpec.model_validate(
        {
            "models": [
                {
                    "name": "m",
                    "engine": "fake",
                    "max_model_len": 64,
                    "lora": {"adapters": {"sql": "./sql", "poet": "org/poet"}, "max_loras": 2},
                    "replicas": {"min_replicas": 1, "max_replicas": 2},  # affinity keys
                }
            ]
        }
    )


@pytest.fixture
def served():
    engine = FakeEngine("m", 64)
    asyncio.run(engine.start())
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(_spec(), {"m": LocalBackend(engine)}, tracer=provider.get_tracer("t"))
    client = TestClient(app, base_url="http://localhost", client=("127.0.0.1", 50000))
    return client, engine, exporter


def _chat(client, model, **extra):
    return client.post(CHAT, json={"model": model, "messages": MESSAGES, "max_tokens": 4, **extra})


@pytest.mark.parametrize("model", ["sql", "m:sql"])
def test_an_adapter_by_name_or_model_colon_name_reaches_the_engine_by_name(served, model):
    client, engine, _ = served
    r = _chat(client, model)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "sql"  # as vLLM answers: the adapter's name
    assert engine.requests[-1].body.model == "sql"  # vLLM's serving layer selects the LoRA


def test_the_base_model_stays_the_base_model(served):
    client, engine, _ = served
    r = _chat(client, "m")
    assert r.status_code == 200 and r.json()["model"] == "m"
    assert engine.requests[-1].body.model == "m"


def test_a_streamed_adapter_answer_names_the_adapter(served):
    client, engine, _ = served
    with client.stream("POST", CHAT, json={"model": "m:poet", "messages": MESSAGES,
                                           "max_tokens": 3, "stream": True}) as r:  # fmt: skip
        text = "".join(r.iter_text())
    assert r.status_code == 200
    assert '"model":"poet"' in text.replace(" ", "")
    assert engine.requests[-1].body.model == "poet"


@pytest.mark.parametrize("model", ["m:nope", "nope"])
def test_an_unknown_adapter_is_model_not_found(served, model):
    client, engine, _ = served
    before = len(engine.requests)
    r = _chat(client, model)
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert len(engine.requests) == before  # nothing reached the engine


def test_models_lists_adapters_with_their_parent(served):
    client, _, _ = served
    cards = client.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["m", "sql", "poet"]
    assert [c.get("parent") for c in cards] == [None, "m", "m"]
    assert cards[1]["max_model_len"] == 64
    assert client.get("/v1/models/poet").json() == cards[2]
    assert client.get("/v1/models/gone").json()["error"]["code"] == "model_not_found"


def test_metrics_and_spans_record_the_adapter(served):
    client, _, exporter = served
    assert _chat(client, "sql").status_code == 200
    assert _chat(client, "m").status_code == 200
    metrics = client.get("/metrics").text
    assert (
        'agentserve_adapter_requests_total{adapter="sql",model="m",status="200",tenant=' in metrics
    )
    assert 'agentserve_adapter_tokens_total{adapter="sql",kind="output",model="m"' in metrics
    assert 'agentserve_requests_total{model="m",status="200"' in metrics  # counted as m too
    spans = [s for s in exporter.get_finished_spans() if "gen_ai.request.model" in s.attributes]
    models = [(s.attributes["gen_ai.request.model"], s.attributes.get("agentserve.lora.adapter"))
              for s in spans]  # fmt: skip
    assert ("sql", "sql") in models and ("m", None) in models


def test_the_affinity_key_differs_by_adapter(served):
    client, engine, _ = served
    keys = []
    for model in ("m", "sql", "m:sql", "poet"):
        assert _chat(client, model).status_code == 200
        keys.append(engine.requests[-1].headers.get(AFFINITY_HEADER))
    assert all(keys)
    base, sql, sql_again, poet = keys
    assert sql == sql_again  # one adapter, one home
    assert len({base, sql, poet}) == 3


def test_an_adapter_request_with_tools_is_admitted_before_its_check_and_still_named(served):
    """A body with tool schemas takes admission first (admission/admit_first.py): its
    admission view already names the base model, the engine body the adapter."""
    client, engine, _ = served
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = _chat(client, "m:sql", tools=[tool])
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "sql" and engine.requests[-1].body.model == "sql"


def test_responses_name_the_adapter(served):
    client, engine, _ = served
    r = client.post("/v1/responses", json={"model": "poet", "input": "hi", "max_output_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "poet" and engine.requests[-1].body.model == "poet"

"""POST /v1/embeddings through the ingress over fake engines (no Ray): answers and usage,
keys, tenant limits, metrics and spans, the wrong-kind 400s, bad bodies."""

from __future__ import annotations

import asyncio
import base64
import struct

import pytest
from agentserve.engine.protocol import EngineDeadError
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_embed import fake_vector
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

LOCAL = "http://localhost"
URL = "/v1/embeddings"
KEY = "sk-embed-0123456789"
SIZE = 8  # the fake engine's vectors


def _spec(tenants=(), **server):
    return DeploymentSpec.model_validate(
        {
            "models": [
                {"name": "m", "engine": "fake", "max_model_len": 64},
                {"name": "e", "engine": "fake", "max_model_len": 64, "task": "embed"},
            ],
            "tenants": list(tenants),
            "server": server,
        }
    )


def _tenant(**rate_limit):
    return {"name": "acme", "api_key_sha256": hash_api_key(KEY), "sla": {},
            "rate_limit": rate_limit}  # fmt: skip


def _client(spec, embed_backend=None, tracer=None):
    generate, embed = FakeEngine("m", 64), FakeEngine("e", 64, task="embed")
    asyncio.run(generate.start())
    asyncio.run(embed.start())
    backends = {"m": LocalBackend(generate), "e": embed_backend or LocalBackend(embed)}
    app = create_app(spec, backends, tracer=tracer)
    return TestClient(app, base_url=LOCAL, client=("127.0.0.1", 50000))


@pytest.fixture
def client():
    return _client(_spec())


def _auth(key=KEY):
    return {"authorization": f"Bearer {key}"}


def test_texts_get_one_vector_each_in_order_with_usage(client):
    r = client.post(URL, json={"model": "e", "input": ["hello world", "three more words"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "e"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    first, second = (d["embedding"] for d in body["data"])
    assert first == pytest.approx(fake_vector("hello world", SIZE))
    assert second == pytest.approx(fake_vector("three more words", SIZE))
    assert len(first) == SIZE and first != second
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


def test_same_input_same_vector_and_a_string_is_one_input(client):
    one = client.post(URL, json={"model": "e", "input": "hello world"}).json()
    again = client.post(URL, json={"model": "e", "input": ["hello world"]}).json()
    assert len(one["data"]) == 1
    assert one["data"][0]["embedding"] == again["data"][0]["embedding"]


def test_token_lists(client):
    single = client.post(URL, json={"model": "e", "input": [5, 6, 7]}).json()
    assert len(single["data"]) == 1 and single["usage"]["prompt_tokens"] == 3
    batch = client.post(URL, json={"model": "e", "input": [[5, 6, 7], [8]]}).json()
    assert len(batch["data"]) == 2 and batch["usage"]["prompt_tokens"] == 4
    assert batch["data"][0]["embedding"] == single["data"][0]["embedding"]


def test_base64_is_little_endian_float32(client):
    r = client.post(URL, json={"model": "e", "input": "hi", "encoding_format": "base64"})
    encoded = r.json()["data"][0]["embedding"]
    assert isinstance(encoded, str)
    decoded = struct.unpack(f"<{SIZE}f", base64.b64decode(encoded))
    assert decoded == pytest.approx(fake_vector("hi", SIZE), rel=1e-6)


def test_keys_are_required_when_tenants_are_configured():
    client = _client(_spec([_tenant()]))
    assert client.post(URL, json={"model": "e", "input": "hi"}).status_code == 401
    bad = client.post(URL, json={"model": "e", "input": "hi"}, headers=_auth("sk-wrong"))
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    assert client.post(URL, json={"model": "e", "input": "hi"}, headers=_auth()).status_code == 200


def test_tokens_count_against_the_tenants_tokens_per_minute():
    client = _client(_spec([_tenant(tokens_per_minute=10)]))
    eight = " ".join(["w"] * 8)
    ok = client.post(URL, json={"model": "e", "input": eight}, headers=_auth())
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 8
    over = client.post(URL, json={"model": "e", "input": "a b c"}, headers=_auth())
    assert over.status_code == 429, over.text
    assert client.post(URL, json={"model": "e", "input": "a b"}, headers=_auth()).status_code == 200


def test_requests_count_against_requests_per_minute():
    client = _client(_spec([_tenant(requests_per_minute=1)]))
    assert client.post(URL, json={"model": "e", "input": "a"}, headers=_auth()).status_code == 200
    assert client.post(URL, json={"model": "e", "input": "a"}, headers=_auth()).status_code == 429


def test_metrics_count_requests_and_prompt_tokens(client):
    client.post(URL, json={"model": "e", "input": ["one two", "three"]})
    client.post(URL, json={"model": "m", "input": "x"})  # 400, counted as such
    text = client.get("/metrics").text
    assert 'agentserve_prompt_tokens_total{model="e",tenant="default"} 3.0' in text
    assert 'agentserve_requests_total{model="e",status="200",tenant="default"} 1.0' in text
    ingress = client.app.state.ingress
    assert ingress.admit_stage.shares.in_flight == {"m": 0, "e": 0}  # every place given back


def test_ingress_span_records_the_embeddings_call():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = _client(_spec(), tracer=provider.get_tracer("test"))
    assert client.post(URL, json={"model": "e", "input": "one two"}).status_code == 200
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "ingress"]
    attributes = dict(span.attributes)
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert attributes["gen_ai.request.model"] == "e"
    assert attributes["gen_ai.usage.input_tokens"] == 2
    assert attributes["http.response.status_code"] == 200


def test_an_embeddings_request_to_a_generate_model_is_refused(client):
    r = client.post(URL, json={"model": "m", "input": "hi"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "model_not_embedding"
    assert r.json()["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
def test_generation_requests_to_an_embedding_model_are_refused(client, path, body):
    r = client.post(path, json={"model": "e", "max_tokens": 4, **body} if path != "/v1/responses"
                    else {"model": "e", **body})  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "model_not_generative"
    assert client.app.state.ingress.admit_stage.shares.in_flight == {"m": 0, "e": 0}


def test_unknown_model_is_404(client):
    r = client.post(URL, json={"model": "nope", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_models_lists_both_kinds(client):
    ids = [card["id"] for card in client.get("/v1/models").json()["data"]]
    assert ids == ["m", "e"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "e", "input": ""}, "input", None),
        ({"model": "e", "input": []}, "input", None),
        ({"model": "e", "input": ["a", ""]}, "input[1]", None),
        ({"model": "e", "input": [[]]}, "input[0]", None),
        ({"model": "e", "input": ["a", 1]}, "input[1]", None),
        ({"model": "e", "input": [-1]}, "input[0]", None),
        ({"model": "e", "input": ["a"] * 257}, "input", "too_many_inputs"),
        ({"model": "e"}, "input", None),
        ({"input": "a"}, "model", None),
        ({"model": "e", "input": "a", "dimensions": 4}, "dimensions", "unsupported_parameter"),
        ({"model": "e", "input": "a", "encoding_format": "int8"}, "encoding_format", None),
        ({"model": "e", "input": "a", "truncate": True}, "truncate", None),
    ],
)
def test_bad_bodies_get_400_naming_the_field(client, body, param, code):
    r = client.post(URL, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == code
    assert error["type"] == "invalid_request_error"


def test_not_json_and_too_large_bodies():
    client = _client(_spec(max_request_body_bytes=1024))
    raw = client.post(URL, content=b"{nope", headers={"content-type": "application/json"})
    assert raw.status_code == 400
    big = client.post(URL, json={"model": "e", "input": "w " * 1000})
    assert big.status_code == 413


def test_an_input_past_the_context_is_the_engines_400(client):
    r = client.post(URL, json={"model": "e", "input": ["ok", " ".join(["w"] * 64)]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert client.app.state.ingress.admit_stage.shares.in_flight == {"m": 0, "e": 0}


class _DiesOnce(LocalBackend):
    """The first embed call finds its replica dead; the next is served."""

    died = False

    async def embed(self, request):
        if not self.died:
            self.died = True
            raise EngineDeadError("replica died")
        return await super().embed(request)


def test_a_dead_replica_is_retried_elsewhere():
    engine = FakeEngine("e", 64, task="embed")
    asyncio.run(engine.start())
    client = _client(_spec(), embed_backend=_DiesOnce(engine))
    r = client.post(URL, json={"model": "e", "input": "hi"})
    assert r.status_code == 200
    assert 'agentserve_migrations_total{model="e"} 1.0' in client.get("/metrics").text

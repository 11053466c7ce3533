"""The OpenAI-compatible ingress over the fake engine (no Ray): shapes, streams, errors."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient

LOCAL = "http://localhost"  # open mode answers only trusted Host names
JSON = {"content-type": "application/json"}

KEY_A, KEY_B = "sk-alpha", "sk-beta"
MSG = [{"role": "user", "content": "hello there world"}]


class Clock:
    """Manual clock: each read advances 10 ms, so latencies are exact."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.01
        return self.now


def _spec(tenants=(), **server):
    return DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 64, "max_num_seqs": 1}],
            "tenants": list(tenants),
            "server": {"max_queue_len": 1, **server},
        }
    )


def _tenant(name, key, **rate_limit):
    return {"name": name, "api_key_sha256": hash_api_key(key), "sla": {}, "rate_limit": rate_limit}


def _client(spec, engine=None):
    engine = engine or FakeEngine("m", 64)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)}, clock=Clock())
    return TestClient(
        app, base_url=LOCAL, client=("127.0.0.1", 50000)
    ), engine  # loopback: /metrics open


@pytest.fixture
def open_client():
    return _client(_spec())


def _events(text):
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_chat_non_stream_shape(open_client):
    client, _ = open_client
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 3})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello there"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def test_max_completion_tokens_and_stop(open_client):
    client, _ = open_client
    r = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MSG, "max_completion_tokens": 2},
    )
    assert r.json()["choices"][0]["message"]["content"] == "echo: hello"
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "stop": [" the"]})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "echo: hello" and choice["finish_reason"] == "stop"


def test_chat_stream_is_incremental_with_usage_last(open_client):
    client, _ = open_client
    body = {
        "model": "m",
        "messages": MSG,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events("".join(r.iter_text()))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [e["choices"][0]["delta"].get("content") for e in events[1:-1]]
    assert len(content) >= 2, "output arrives in several chunks"
    assert "".join(content) == "echo: hello there world"
    assert all(e["usage"] is None for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8,
                                   "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def test_stream_without_include_usage_has_no_usage_chunk(open_client):
    client, _ = open_client
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "stream": True})
    events = _events(r.text)
    assert all(e["choices"] for e in events) and all("usage" not in e for e in events)


def test_completions_stream_and_non_stream(open_client):
    client, _ = open_client
    r = client.post("/v1/completions", json={"model": "m", "prompt": "a b c", "max_tokens": 2})
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "echo: a"
    r = client.post("/v1/completions", json={"model": "m", "prompt": "a b", "stream": True})
    events = _events(r.text)
    assert "".join(e["choices"][0]["text"] for e in events) == "echo: a b"


def test_an_empty_prompt_list_is_a_clear_400(open_client):
    client, engine = open_client
    r = client.post("/v1/completions", json={"model": "m", "prompt": []})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt"
    assert "non-empty list" in error["message"]
    assert not engine.requests


def test_tools_and_json_response_format(open_client):
    client, _ = open_client
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    r = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MSG, "tools": tools, "tool_choice": "required"},
    )
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"]) == {"text": "hello there world"}
    r = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MSG, "response_format": {"type": "json_object"}},
    )
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"echo": "hello there world"}


def test_sampling_params_reach_the_engine(open_client):
    client, engine = open_client
    client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MSG, "temperature": 0.5, "top_p": 0.9, "seed": 7},
        headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "x-session-id": "s1"},
    )
    request = engine.requests[-1]
    assert (request.body.temperature, request.body.top_p, request.body.seed) == (0.5, 0.9, 7)
    assert request.headers["traceparent"].startswith("00-aaaa")
    assert request.headers["x-session-id"] == "s1"
    assert request.headers["x-agentserve-tenant"] == "default"


def test_malformed_traceparent_is_dropped(open_client):
    client, engine = open_client
    client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MSG},
        headers={"traceparent": "00-" + "0" * 32 + "-" + "b" * 16 + "-01"},
    )
    assert "traceparent" not in engine.requests[-1].headers


def test_models_and_health(open_client):
    client, engine = open_client
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["m"]
    assert client.get("/v1/models/m").json() == models["data"][0]  # models.retrieve()
    missing = client.get("/v1/models/org/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert client.get("/health").status_code == 200
    engine.healthy = False
    assert client.get("/health").status_code == 200  # the answer is cached for 1 s
    client.app.state.ingress.endpoints.health_cache.ttl_s = 0.0  # expired
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["models"]["m"].startswith("unavailable")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "m", "messages": []}, 400, "messages"),
        ({"messages": MSG}, 400, "model"),
        ({"model": "m", "messages": MSG, "temperature": 3}, 400, "temperature"),
        ({"model": "m", "messages": MSG, "top_p": 0}, 400, "top_p"),
        ({"model": "m", "messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "m", "messages": MSG, "n": 9}, 400, "n"),
        ({"model": "m", "messages": MSG, "tool_choice": "required"}, 400, "tool_choice"),
        ({"model": "m", "messages": MSG, "response_format": {"type": "x"}}, 400, None),
        ({"model": "nope", "messages": MSG}, 404, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": "w " * 80}]}, 400, "messages"),
        ({"model": "m", "messages": MSG, "max_tokens": 63}, 400, "messages"),
    ],
)
def test_client_mistakes_are_openai_4xx(open_client, body, status, param):
    client, _ = open_client
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param


def test_context_length_error_code(open_client):
    client, _ = open_client
    r = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "w " * 80}]},
    )
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_invalid_json_and_unknown_route(open_client):
    client, _ = open_client
    r = client.post("/v1/chat/completions", content=b"{not json", headers=JSON)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/v1/nothing").json()["error"]["message"] == "Not Found"


def test_auth_maps_keys_to_tenants():
    client, engine = _client(_spec([_tenant("alpha", KEY_A), _tenant("beta", KEY_B)]))
    body = {"model": "m", "messages": MSG}
    assert client.post("/v1/chat/completions", json=body).status_code == 401
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models").status_code == 401
    for key, tenant in ((KEY_A, "alpha"), (KEY_B, "beta")):
        r = client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert r.status_code == 200
        assert engine.requests[-1].headers["x-agentserve-tenant"] == tenant
    metrics = client.get("/metrics").text
    assert 'agentserve_requests_total{model="m",status="200",tenant="alpha"} 1.0' in metrics
    assert 'agentserve_requests_total{model="m",status="401"' not in metrics


def test_requests_per_minute_gives_429():
    client, _ = _client(_spec([_tenant("alpha", KEY_A, requests_per_minute=1)]))
    headers = {"Authorization": f"Bearer {KEY_A}"}
    body = {"model": "m", "messages": MSG}
    assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
    r = client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_exceeded"
    assert int(r.headers["retry-after"]) >= 1


def test_full_model_queue_gives_503():
    spec = _spec()  # capacity = max_num_seqs (1) + max_queue_len (1) = 2 in flight
    client, _ = _client(spec)
    ingress = client.app.state.ingress
    ingress.admit_stage.shares.in_flight["m"] = 2
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    ingress.admit_stage.shares.in_flight["m"] = 1
    assert (
        client.post("/v1/chat/completions", json={"model": "m", "messages": MSG}).status_code == 200
    )


def test_unstarted_engine_is_503_not_500():
    engine = FakeEngine("m", 64)
    client = TestClient(create_app(_spec(), {"m": LocalBackend(engine)}), base_url=LOCAL)
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
    assert r.status_code == 503


def test_metrics_exposition_has_latency_tokens_and_dflash(open_client):
    client, _ = open_client
    client.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 4})
    text = client.get("/metrics").text
    labels = 'model="m",tenant="default"'
    assert f"agentserve_time_to_first_token_seconds_count{{{labels}}} 1.0" in text
    assert f"agentserve_time_per_output_token_seconds_count{{{labels}}} 1.0" in text
    assert f"agentserve_prompt_tokens_total{{{labels}}} 4.0" in text
    assert f"agentserve_output_tokens_total{{{labels}}} 4.0" in text
    assert 'agentserve_requests_in_flight{model="m"} 0.0' in text
    # fake: 2 tokens per verify step -> 2 steps, 1 accepted each, acceptance length 2
    assert 'agentserve_spec_decode_drafts_total{model="m"} 2.0' in text
    assert 'agentserve_spec_decode_accepted_tokens_total{model="m"} 2.0' in text
    assert 'agentserve_spec_decode_acceptance_length{model="m"} 2.0' in text
    # the same by running batch size (one request: batch 1)
    assert 'agentserve_spec_decode_batch_drafts_total{batch="1",model="m"} 2.0' in text
    assert 'agentserve_spec_decode_batch_accepted_tokens_total{batch="1",model="m"} 2.0' in text
    assert 'agentserve_spec_decode_batch_acceptance_length{batch="1",model="m"} 2.0' in text


def test_client_disconnect_aborts_engine_request():
    engine = FakeEngine("m", 64, token_delay_s=0.05)
    client, _ = _client(_spec(), engine)
    body = {"model": "m", "messages": MSG, "stream": True, "max_tokens": 30}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        next(r.iter_lines())
    for _ in range(50):
        if engine.aborted:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert engine.aborted == [engine.requests[-1].request_id]
    assert client.app.state.ingress.admit_stage.shares.in_flight["m"] == 0

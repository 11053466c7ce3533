"""Hostile and malformed input at the ingress (fake engine): the explicit cases each get
their exact OpenAI error, 1,000 hypothesis-generated requests get no 5xx, and the edge
checks behind them (body limit, JSON decoding, value walk, union error paths)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from agentserve.api.body import decode_json
from agentserve.api.errors import InvalidRequestError
from agentserve.api.openai import parse_request
from agentserve.api.validate import check_values, param_path

from tests.reliability.fuzz import fuzz
from tests.reliability.hostile_input import (
    HOSTILE_CASES,
    check_answer,
    explicit_cases,
    fuzz_client,
)

MSG = [{"role": "user", "content": "hi"}]


def test_every_explicit_case_gets_its_exact_error():
    outcome = explicit_cases()
    assert outcome.details["mismatched"] == {}
    assert outcome.requests == len(HOSTILE_CASES) >= 45
    assert (outcome.lost, outcome.errors_5xx, outcome.restarts) == (0, 0, 0)


def test_fuzzing_1000_requests_gives_no_5xx_and_only_openai_errors():
    outcome = fuzz()
    assert outcome.requests >= 1000
    assert outcome.details["failures"] == []
    assert (outcome.lost, outcome.errors_5xx, outcome.restarts) == (0, 0, 0)
    assert outcome.details["leaked"] == 0, "every request released its model slot"
    statuses = outcome.details["by_status"]
    assert statuses.get("200", 0) >= 50, "the fuzzer also gets requests through to the engine"
    assert statuses.get("400", 0) >= 300
    assert set(outcome.details["by_route"]) == {"chat", "completion", "models"}


def _response(status, body, content_type="application/json"):
    text = body if isinstance(body, str) else json.dumps(body)
    return SimpleNamespace(
        status_code=status,
        text=text,
        headers={"content-type": content_type},
        json=lambda: json.loads(text),
    )


ERROR = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}


@pytest.mark.parametrize(
    ("response", "stream", "bad"),
    [
        (_response(400, ERROR), False, False),
        (_response(200, {"choices": []}), False, False),
        (_response(200, "data: {}\n\ndata: [DONE]\n\n", "text/event-stream"), True, False),
        (_response(500, ERROR), False, True),
        (_response(503, ERROR), False, True),
        (_response(422, {"detail": "x"}), False, True),
        (_response(400, {"error": {"message": "m"}}), False, True),
        (_response(400, "not json"), False, True),
        (_response(200, {"ok": 1}), False, True),
        (_response(200, "data: {}\n\n", "text/event-stream"), True, True),
        (
            _response(200, 'data: {"error": {}}\n\ndata: [DONE]\n\n', "text/event-stream"),
            True,
            True,
        ),
    ],
)
def test_fuzz_oracle_flags_bad_answers(response, stream, bad):
    assert (check_answer(response, stream) is not None) is bad


def test_chunked_body_over_the_limit_is_413_without_content_length():
    client, engine = fuzz_client(max_request_body_bytes=1024)

    def chunks():
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"w" * 100
        yield b'"}]}'

    r = client.post("/v1/chat/completions", content=chunks())
    assert "content-length" not in r.request.headers
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert "at least" in r.json()["error"]["message"]
    assert not engine.requests


def test_body_just_under_the_limit_is_served():
    client, _ = fuzz_client(max_request_body_bytes=1024)
    body = {"model": "m", "messages": [{"role": "user", "content": "w " * 20}], "max_tokens": 2}
    assert client.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"\xc3\x28", "not valid UTF-8: byte 0xc3 at offset 0"),
        (b'{"a": }', "not valid JSON: Expecting value at line 1 column 7"),
        (b"[" * 50_000, "nested too deep"),
        (b"1" * 5000, "not valid JSON"),
    ],
)
def test_decode_json_errors(raw, says):
    with pytest.raises(InvalidRequestError) as err:
        decode_json(raw)
    assert says in err.value.message


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"logit_bias": {"5": float("inf")}}, "logit_bias.5"),
        ({"messages": [{"content": "ok"}, {"content": "a\ud800"}]}, "messages[1].content"),
        ({"metadata": {"k\udfff": 1}}, "metadata.k\\udfff"),
        ({"tools": json.loads("[" * 70 + "]" * 70)}, "tools"),
    ],
)
def test_check_values_names_the_bad_value(data, param):
    with pytest.raises(InvalidRequestError) as err:
        check_values(data)
    assert err.value.param == param
    err.value.message.encode("utf-8")  # renderable: surrogates are escaped


def test_check_values_accepts_ordinary_bodies():
    check_values({"model": "m", "messages": MSG, "temperature": 0.5, "stop": ["\n", "é"]})


def test_param_path():
    assert param_path(("messages", 0, "content")) == "messages[0].content"
    assert param_path(("tools", 1, "function", "name")) == "tools[1].function.name"
    assert param_path(()) is None


@pytest.mark.parametrize(
    ("data", "param", "says"),
    [
        ({"stop": 5}, "stop", "valid string"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "valid string"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "'json_schema'"),
        ({"user": 7}, "user", "valid string"),
        ({"max_tokens": "ten"}, "max_tokens", "must be an integer"),  # api/json_types.py
    ],
)
def test_union_errors_name_the_field_sent(data, param, says):
    with pytest.raises(InvalidRequestError) as err:
        parse_request("chat", {"model": "m", "messages": MSG, **data})
    assert err.value.param == param and says in err.value.message


@pytest.mark.parametrize(
    ("data", "context", "param"),
    [
        ({"max_tokens": 64}, 64, "max_tokens"),
        ({"max_completion_tokens": 100}, 64, "max_completion_tokens"),
    ],
)
def test_max_tokens_against_the_context(data, context, param):
    with pytest.raises(InvalidRequestError) as err:
        parse_request("chat", {"model": "m", "messages": MSG, **data}, {"m": context})
    assert err.value.param == param and err.value.code == "context_length_exceeded"
    parse_request(
        "chat", {"model": "m", "messages": MSG, "max_tokens": context - 1}, {"m": context}
    )


def test_tool_names_allow_namespaces_and_schemas_with_refs():
    tool = {
        "type": "function",
        "function": {
            "name": "files.read_file",
            "parameters": {
                "type": "object",
                "$defs": {"p": {"type": "string"}},
                "properties": {"path": {"$ref": "#/$defs/p"}},
                "required": ["path"],
            },
        },
    }
    parse_request("chat", {"model": "m", "messages": MSG, "tools": [tool]})


def test_a_client_leaving_while_sending_the_body_is_a_499_not_a_server_error(caplog):
    """Content-Length 1000, part of the body, then the client disconnects: recorded as
    client-closed, with no error logged (a 500 and a traceback before)."""
    import asyncio

    client, _ = fuzz_client()
    app = client.app
    messages = [
        {"type": "http.request", "body": b'{"model": "m", "mess', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent = []

    async def receive():
        return messages.pop(0) if messages else await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    headers = [(b"host", b"localhost"), (b"content-type", b"application/json")]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "headers": [*headers, (b"content-length", b"1000")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [499]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]

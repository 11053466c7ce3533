"""/v1/responses under junk values: every parameter with every junk value answers 200 or
an OpenAI-shaped 400 naming a parameter, never a 5xx (ASGI ingress, fake engine)."""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest
from test_responses_api import KEY, Served

FIELDS = (
    "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
    "tool_choice", "text", "reasoning", "include", "truncation", "metadata",
    "parallel_tool_calls", "store", "user", "stream", "max_tool_calls", "service_tier",
    "stream_options", "previous_response_id",
)  # fmt: skip
JUNK = (
    None, 0, -1, 1.5, True, "x", "", [], [None], [1], ["x"], {}, {"type": None},
    {"type": "function"}, {"type": "function", "name": 5}, [{}], [{"type": "message"}],
    [{"role": "user"}], [{"role": "user", "content": [None]}],
    [{"role": "user", "content": [{"type": "input_text", "text": 5}]}],
    [{"type": "function_call"}], [{"type": "function_call_output", "call_id": "a"}],
    [{"type": "function", "name": "n", "parameters": 5}], {"format": "json"},
    {"format": {"type": "json_schema"}}, {"format": {"type": "json_schema", "name": "x",
    "schema": 5}}, {"effort": 5},
)  # fmt: skip


def test_junk_parameters_get_200_or_a_named_400():
    served = Served()

    async def sweep():
        http = httpx2.AsyncClient(transport=served.transport, base_url="http://t")
        headers = {"authorization": f"Bearer {KEY}"}
        answers = []
        for field in FIELDS:
            for junk in JUNK:
                body = {"model": "m", "input": "hi", field: junk}
                response = await http.post("/v1/responses", json=body, headers=headers)
                streamed = response.headers["content-type"].startswith("text/event-stream")
                body = response.text if streamed else response.json()
                answers.append((field, junk, response.status_code, body))
        return answers

    answers = asyncio.run(sweep())
    refused = 0
    for field, junk, status, body in answers:
        assert status in (200, 400), (field, junk, status, body)
        if status == 400:
            refused += 1
            error = body["error"]
            assert error["type"] == "invalid_request_error" and error["message"], body
            assert error["param"], (field, junk, body)
    assert refused > len(answers) // 2  # most junk is refused, not ignored


def test_echoed_parameters_keep_their_types():
    served = Served()

    async def post(body):
        http = httpx2.AsyncClient(transport=served.transport, base_url="http://t")
        headers = {"authorization": f"Bearer {KEY}"}
        return await http.post("/v1/responses", json=body, headers=headers)

    for name, value in (("metadata", {"a": 1}), ("store", "yes"), ("max_tool_calls", 0)):
        response = asyncio.run(post({"model": "m", "input": "hi", name: value}))
        assert response.status_code == 400 and response.json()["error"]["param"] == name
    ok = asyncio.run(post({"model": "m", "input": "hi", "metadata": {"k": "v"}}))
    assert ok.status_code == 200 and ok.json()["metadata"] == {"k": "v"}


def test_a_large_body_is_translated_on_the_validation_worker():
    """Past INLINE_BODY_BYTES the body is decoded, translated and validated off the
    event loop (admission/parsing.py): the result is the same."""
    from agentserve.admission.parsing import INLINE_BODY_BYTES

    served = Served()
    tool = {
        "type": "function",
        "name": "lookup",
        "description": "d" * (INLINE_BODY_BYTES + 10),
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    }

    async def run():
        client = served.client()
        return await client.responses.create(
            model="m", input="cat", tools=[tool], tool_choice="required"
        )

    (call,) = asyncio.run(run()).output
    assert call.type == "function_call" and call.arguments == '{"word": "cat"}'
    assert len(served.engine.requests[-1].body.tools[0].function.description) > INLINE_BODY_BYTES


def _post_raw(served: Served, raw: bytes) -> httpx2.Response:
    async def post():
        http = httpx2.AsyncClient(transport=served.transport, base_url="http://t")
        headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        return await http.post("/v1/responses", content=raw, headers=headers)

    return asyncio.run(post())


def test_a_role_that_is_a_list_or_an_object_is_a_named_400():
    """Issue 30 item 8: an unhashable role raised TypeError (500)."""
    served = Served()
    for role in (["user"], {"a": 1}, 5, None):
        body = {"model": "m", "input": [{"type": "message", "role": role, "content": "hi"}]}
        response = _post_raw(served, json.dumps(body).encode())
        assert response.status_code == 400, (role, response.text)
        error = response.json()["error"]
        assert error["param"] == "input[0].role" and error["type"] == "invalid_request_error"
        assert "must be one of user, system, developer, assistant" in error["message"]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model":"m","input":"hi","stream_options":{"x":NaN}}', "stream_options.x"),
        (b'{"model":"m","input":"hi","reasoning":{"effort":"low","x":Infinity}}', "reasoning.x"),
        (b'{"model":"m","input":"hi","metadata":{"k":"a\\ud800b"}}', "metadata.k"),
        (b'{"model":"m","input":"hi","text":{"format":{"type":"text"},"v":"\\udfff"}}', "text.v"),
    ],
)
def test_nan_or_a_lone_surrogate_in_an_echoed_field_is_a_named_400(raw, param):
    """Issue 30 item 8: fields only echoed back were not checked, so the Response could
    not be rendered (500)."""
    response = _post_raw(Served(), raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "finite number" in error["message"] or "not valid Unicode" in error["message"]

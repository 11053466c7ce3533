"""POST /v1/responses through the `openai` client and the OpenAI Agents SDK (ASGI ingress,
fake engine): text and function calls, streamed and not, the refused parameters, auth."""

from __future__ import annotations

import asyncio
import json

import httpx2
import openai
import pytest
from agentserve.api.errors import InvalidRequestError
from agentserve.api.responses import ResponsesRequest
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

KEY = "sk-test"
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


class Served:
    """The ingress with a key-protected tenant over one fake engine, and clients for it."""

    def __init__(self):
        spec = DeploymentSpec.model_validate(
            {
                "models": [{"name": "m", "engine": "fake", "max_model_len": 256}],
                "tenants": [{"name": "t", "api_key_sha256": hash_api_key(KEY), "sla": {}}],
            }
        )
        self.engine = FakeEngine("m", 256)
        asyncio.run(self.engine.start())
        self.transport = httpx2.ASGITransport(
            app=create_app(spec, {"m": LocalBackend(self.engine)})
        )

    def client(self, key: str = KEY) -> openai.AsyncOpenAI:
        http = httpx2.AsyncClient(transport=self.transport, base_url="http://t")
        return openai.AsyncOpenAI(
            api_key=key, base_url="http://t/v1", http_client=http, max_retries=0
        )

    def last_chat(self):
        """The chat-completion request the engine received last."""
        return self.engine.requests[-1].body


@pytest.fixture
def served():
    return Served()


def test_non_stream_text_with_instructions_and_usage(served):
    async def run():
        client = served.client()
        plain = await client.responses.create(model="m", input="hi you")
        told = await client.responses.create(
            model="m",
            instructions="answer briefly",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "hi you"}]}],
            temperature=0.0,
            top_p=0.5,
        )
        return plain, told

    plain, told = asyncio.run(run())
    assert plain.id.startswith("resp_") and plain.object == "response"
    assert plain.status == "completed" and plain.output_text == "echo: hi you"
    (message,) = plain.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.status == "completed"
    assert plain.usage.output_tokens == 3
    assert plain.usage.total_tokens == plain.usage.input_tokens + 3
    assert told.output_text == "echo: hi you" and told.instructions == "answer briefly"
    assert told.temperature == 0.0 and told.top_p == 0.5
    assert told.usage.input_tokens >= plain.usage.input_tokens + 2  # + the instructions
    chat = served.last_chat()
    assert [m["role"] for m in chat.messages] == ["system", "user"]
    assert chat.temperature == 0.0 and chat.top_p == 0.5


def test_stream_events_assemble_the_final_text(served):
    async def run():
        stream = await served.client().responses.create(
            model="m", input="one two three", stream=True
        )
        return [event async for event in stream]

    events = asyncio.run(run())
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert text == "echo: one two three" == done.output_text
    assert events[-4].text == text and done.status == "completed"
    assert done.usage.output_tokens == 4 and done.usage.total_tokens > 4
    assert events[0].response.id == done.id and events[0].response.status == "in_progress"


def test_raw_stream_names_each_event_and_sends_no_done(served):
    async def run():
        http = httpx2.AsyncClient(transport=served.transport, base_url="http://t")
        body = {"model": "m", "input": "hi", "stream": True}
        headers = {"authorization": f"Bearer {KEY}"}
        return await http.post("/v1/responses", json=body, headers=headers)

    response = asyncio.run(run())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in response.text.split("\n\n") if f]
    assert "[DONE]" not in response.text
    for frame in frames:
        event, data = frame.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == event[7:]
    assert response.headers["x-request-id"].startswith("resp_")


def test_function_call_streamed_and_not(served):
    async def run():
        client = served.client()
        plain = await client.responses.create(
            model="m", input="define cat", tools=[TOOL], tool_choice="required"
        )
        async with client.responses.stream(
            model="m",
            input="define cat",
            tools=[TOOL],
            tool_choice={"type": "function", "name": "lookup"},
        ) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
        return plain, events, final

    plain, events, final = asyncio.run(run())
    for response in (plain, final):
        (call,) = response.output
        assert call.type == "function_call" and call.name == "lookup"
        assert json.loads(call.arguments) == {"word": "define cat"}
        assert call.call_id == "call_fake0" and call.status == "completed"
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == final.output[0].arguments and types[-1] == "response.completed"
    chat = served.last_chat()
    assert chat.tools[0].function.name == "lookup" and chat.tool_choice.function.name == "lookup"


def test_function_call_output_round_trip_becomes_chat_tool_messages(served):
    async def run():
        return await served.client().responses.create(
            model="m",
            input=[
                {"role": "developer", "content": "use tools"},
                {"role": "user", "content": "define cat"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "lookup",
                    "arguments": '{"word": "cat"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "a small animal"},
            ],
            tools=[TOOL],
        )

    response = asyncio.run(run())
    assert response.output_text == "echo: define cat"
    roles = [m["role"] for m in served.last_chat().messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assistant, tool = served.last_chat().messages[2:]
    (call,) = assistant["tool_calls"]
    assert call["id"] == "call_1" and call["function"]["name"] == "lookup"
    assert tool["tool_call_id"] == "call_1" and tool["content"] == "a small animal"


def test_translation_merges_an_assistant_turn_and_its_calls():
    items = [
        {"role": "user", "content": "go"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "calling", "annotations": []}],
        },
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "a", "output": [
            {"type": "input_text", "text": "x"}, {"type": "input_text", "text": "y"}]},
    ]  # fmt: skip
    chat = ResponsesRequest().translate({"model": "m", "input": items, "max_output_tokens": 7})
    assert chat["max_completion_tokens"] == 7
    user, assistant, tool = chat["messages"]
    assert user == {"role": "user", "content": "go"}
    assert assistant["content"] == "calling"
    assert [c["id"] for c in assistant["tool_calls"]] == ["a", "b"]
    assert tool == {"role": "tool", "tool_call_id": "a", "content": "x\ny"}  # as vLLM joins


def test_max_output_tokens_makes_an_incomplete_response(served):
    async def run():
        client = served.client()
        plain = await client.responses.create(model="m", input="a b c d", max_output_tokens=2)
        stream = await client.responses.create(
            model="m", input="a b c d", max_output_tokens=2, stream=True
        )
        return plain, [e async for e in stream]

    plain, events = asyncio.run(run())
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    assert plain.output_text == "echo: a" and plain.usage.output_tokens == 2
    assert plain.output[0].status == "incomplete"
    assert events[-1].type == "response.incomplete" and events[-1].response.usage.output_tokens == 2


def test_text_format_json_schema_becomes_response_format(served):
    schema = {"type": "object", "properties": {"echo": {"type": "string"}}}
    fmt = {"type": "json_schema", "name": "reply", "schema": schema, "strict": True}

    async def run():
        return await served.client().responses.create(model="m", input="hi", text={"format": fmt})

    response = asyncio.run(run())
    assert json.loads(response.output_text) == {"echo": "hi"}
    sent = served.last_chat().response_format
    assert sent.type == "json_schema" and sent.json_schema.name == "reply"
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("extra", "param", "match"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"conversation": "conv_1"}, "conversation", "stateless"),
        ({"background": True}, "background", "stateless"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", "not supported"),
        ({"truncation": "auto"}, "truncation", "disabled"),
        ({"top_logprobs": 2}, "top_logprobs", "log probabilities"),
        ({"include": ["message.output_text.logprobs"]}, "include", "log probabilities"),
        ({"frequency_penalty_x": 1}, "frequency_penalty_x", "Unknown parameter"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "stateless"),
        ({"input": []}, "input", "non-empty list"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "must be one of"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0]",
            "text models",
        ),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type", "must be one of"),
        ({"max_output_tokens": 0}, "max_output_tokens", "positive"),
        # the chat validation's errors name the Responses parameters
        ({"max_output_tokens": 999}, "max_output_tokens", "'max_output_tokens' is 999"),
        (
            {"tools": [{"type": "function", "name": "a b"}]},
            "tools[0].name",
            r"Invalid 'tools\[0\]\.name'",
        ),
        ({"tool_choice": "required"}, "tool_choice", "tools"),
    ],
)
def test_unsupported_requests_are_refused_with_400(served, extra, param, match):
    async def run():
        return await served.client().responses.create(model="m", input="hi", extra_body=extra)

    with pytest.raises(openai.BadRequestError, match=match) as caught:
        asyncio.run(run())
    assert caught.value.body["param"] == param
    assert not served.engine.requests


def test_engine_errors_name_the_responses_parameters(served):
    async def run():
        return await served.client().responses.create(model="m", input="x " * 300)

    with pytest.raises(openai.BadRequestError, match="context length") as caught:
        asyncio.run(run())
    assert caught.value.body["param"] == "input"


def test_store_is_accepted_and_nothing_is_stored(served):
    async def run():
        client = served.client()
        return [
            await client.responses.create(model="m", input="hi", store=s) for s in (True, False)
        ]

    for response in asyncio.run(run()):
        assert response.output_text == "echo: hi" and response.store is False


def test_translate_refuses_a_non_object_body():
    with pytest.raises(InvalidRequestError, match="JSON object"):
        ResponsesRequest().translate(["m"])


def test_missing_or_wrong_key_is_401(served):
    async def run():
        return await served.client("sk-wrong").responses.create(model="m", input="hi")

    with pytest.raises(openai.AuthenticationError):
        asyncio.run(run())
    assert not served.engine.requests


def test_unknown_model_is_404(served):
    async def run():
        return await served.client().responses.create(model="other", input="hi")

    with pytest.raises(openai.NotFoundError):
        asyncio.run(run())


def test_engine_death_mid_stream_is_an_error_event(served):
    async def run():
        served.engine.inject("crash", 2)
        stream = await served.client().responses.create(
            model="m", input="a b c d e f g h", stream=True
        )
        return [e.type async for e in stream]

    with pytest.raises(openai.APIError):
        asyncio.run(run())


def test_builder_orders_reasoning_text_and_calls_as_items():
    from agentserve.api.responses_render import ResponsesBuilder
    from agentserve.engine.protocol import Delta

    call = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "f"}}
    args = {"index": 0, "function": {"arguments": '{"a": 1}'}}
    deltas = [
        Delta(reasoning="think", prompt_tokens=4, completion_tokens=1),
        Delta(reasoning=" more", text="Sure", prompt_tokens=4, completion_tokens=3),
        Delta(text=".", tool_calls=(call,), prompt_tokens=4, completion_tokens=5),
        Delta(tool_calls=(args,), finish_reason="tool_calls", prompt_tokens=4, completion_tokens=7),
    ]
    streamed = ResponsesBuilder("r1", "m", {})
    frames = streamed.start() + b"".join(streamed.delta(d) for d in deltas) + streamed.end(4, 7)
    events = [json.loads(f.split(b"\ndata: ")[1]) for f in frames.split(b"\n\n") if f]
    final = ResponsesBuilder("r1", "m", {}).final(deltas)
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    reasoning, message, function = final["output"]
    assert reasoning["content"][0]["text"] == "think more"
    assert message["content"][0]["text"] == "Sure."
    assert function["arguments"] == '{"a": 1}' and function["call_id"] == "call_9"
    assert final["usage"]["total_tokens"] == 11 and final["status"] == "completed"
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == [
        "reasoning",
        "message",
        "function_call",
    ]
    reasoning_deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(reasoning_deltas) == "think more"
    completed = events[-1]["response"]

    def without_ids(items):
        return [{k: v for k, v in item.items() if k != "id"} for item in items]

    assert without_ids(completed["output"]) == without_ids(final["output"])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))

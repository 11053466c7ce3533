"""VLLMEngine's side of migration, without starting vLLM: token ids out of vLLM's SSE, and
the request body that continues a dead replica's output."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentserve.engine.protocol import Continuation, EngineRequest, EngineRequestError
from agentserve.engine.vllm_engine import _streaming_body, continuation_body, deltas_from_sse
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

MSG = [{"role": "user", "content": "hi"}]


def _sse(*payloads):
    async def events():
        for p in payloads:
            yield f"data: {json.dumps(p)}\n\n"
        yield "data: [DONE]\n\n"

    return events()


def _chunk(content=None, ids=None, finish=None, completion=0, **top):
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "token_ids": ids}
    usage = {"prompt_tokens": 3, "completion_tokens": completion}
    return {"choices": [choice], "usage": usage, **top}


def test_token_ids_ride_on_the_delta_that_delivers_their_text():
    """vLLM's chat stream with return_token_ids: prompt ids in the role chunk, ids per
    chunk; a chunk whose text is held back (e.g. half a UTF-8 character) passes its ids
    on to the next delta, so delivered text and delivered ids stay aligned."""
    payloads = [
        _chunk("", [], prompt_token_ids=[1, 2, 3]),  # role chunk
        _chunk("He", [10], completion=1),
        _chunk(None, [11], completion=2),  # text held back
        _chunk("llo é", [12], completion=3),
        _chunk("", [13], finish="stop", completion=4),
    ]

    async def run():
        return [d async for d in deltas_from_sse("chat", _sse(*payloads))]

    deltas = asyncio.run(run())
    assert [(d.text, d.token_ids) for d in deltas] == [
        ("He", (10,)),
        ("llo é", (11, 12)),
        ("", (13,)),
    ]
    assert deltas[0].prompt_token_ids == (1, 2, 3) and deltas[1].prompt_token_ids == ()
    assert deltas[-1].finish_reason == "stop" and deltas[-1].completion_tokens == 4


def test_completion_prompt_ids_come_from_the_choice():
    choice = {"index": 0, "text": "a", "token_ids": [7], "prompt_token_ids": [4, 5]}
    payloads = [
        {"choices": [choice], "usage": {"prompt_tokens": 2, "completion_tokens": 1}},
        {"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "length"}]},
    ]

    async def run():
        return [d async for d in deltas_from_sse("completion", _sse(*payloads))]

    first, last = asyncio.run(run())
    assert first.prompt_token_ids == (4, 5) and first.token_ids == (7,)
    assert last.finish_reason == "length" and last.prompt_token_ids == ()


def test_streaming_body_asks_for_token_ids_except_with_echo():
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG})
    assert _streaming_body(chat, "r1").return_token_ids is True
    echo = CompletionRequest.model_validate({"model": "m", "prompt": "x", "echo": True})
    assert not _streaming_body(echo, "r1").return_token_ids


def test_token_continuation_is_a_completion_of_the_exact_tokens():
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": MSG,
            "max_completion_tokens": 5,
            "temperature": 0,
            "stop": ["\n\n"],
            "seed": 3,
        }
    )
    cont = Continuation("He", 1, token_ids=(10,), prompt_token_ids=(1, 2, 3))
    kind, out = continuation_body(EngineRequest("r", "chat", body, continuation=cont))
    assert kind == "completion" and isinstance(out, CompletionRequest)
    assert out.prompt == [1, 2, 3, 10] and out.max_tokens == 5
    assert (out.temperature, out.stop, out.seed) == (0, ["\n\n"], 3)


def test_text_continuation_continues_the_assistant_message_or_the_prompt():
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG})
    cont = Continuation("He", 1)
    kind, out = continuation_body(EngineRequest("r", "chat", body, continuation=cont))
    assert kind == "chat" and out.messages[-1] == {"role": "assistant", "content": "He"}
    assert out.continue_final_message and not out.add_generation_prompt
    plain = CompletionRequest.model_validate({"model": "m", "prompt": "Say"})
    kind, out = continuation_body(EngineRequest("r", "completion", plain, continuation=cont))
    assert kind == "completion" and out.prompt == "SayHe"
    ids = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2]})
    with pytest.raises(EngineRequestError):
        continuation_body(EngineRequest("r", "completion", ids, continuation=cont))

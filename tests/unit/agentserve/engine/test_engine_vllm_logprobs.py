"""VLLMEngine's log probabilities without starting vLLM: SSE chunks built with vLLM's own
protocol classes and serialized as its serving layer does (model_dump_json with
exclude_unset, chat_completion/serving.py and completion/serving.py of vLLM 0.32) become
Delta.logprobs, riding with their text; a continuation asks for them again."""

from __future__ import annotations

import asyncio

from agentserve.engine.logprobs import to_chat, to_completion
from agentserve.engine.protocol import Continuation, EngineRequest
from agentserve.engine.vllm_engine import _chat_top, continuation_body, deltas_from_sse
from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import UsageInfo

MSG = [{"role": "user", "content": "hi"}]


def _usage(completion):
    return UsageInfo(prompt_tokens=3, completion_tokens=completion, total_tokens=3 + completion)


def _entry(token, logprob, alts=()):
    top = [ChatCompletionLogProb(token=token, logprob=logprob, bytes=list(token.encode()))]
    top += [ChatCompletionLogProb(token=t, logprob=v, bytes=list(t.encode())) for t, v in alts]
    return ChatCompletionLogProbsContent(
        token=token, logprob=logprob, bytes=list(token.encode()), top_logprobs=top
    )


def _chat_chunk(delta, entries=None, finish=None, completion=0, ids=None):
    choice = ChatCompletionResponseStreamChoice(
        index=0,
        delta=delta,
        logprobs=None if entries is None else ChatCompletionLogProbs(content=entries),
        finish_reason=finish,
        token_ids=ids,
    )
    chunk = ChatCompletionStreamResponse(
        id="chatcmpl-x", created=1, model="m", choices=[choice], usage=_usage(completion)
    )
    return f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"


def _completion_chunk(text, tokens, values, tops, offset, finish=None, completion=0):
    offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    logprobs = CompletionLogProbs(
        text_offset=offsets, token_logprobs=values, tokens=tokens, top_logprobs=tops
    )
    choice = CompletionResponseStreamChoice(
        index=0, text=text, logprobs=logprobs, finish_reason=finish
    )
    chunk = CompletionStreamResponse(
        id="cmpl-x", created=1, model="m", choices=[choice], usage=_usage(completion)
    )
    return f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"


def _deltas(kind, events, top=None):
    async def stream():
        for e in events:
            yield e
        yield "data: [DONE]\n\n"

    async def run():
        return [d async for d in deltas_from_sse(kind, stream(), top)]

    return asyncio.run(run())


def test_chat_logprobs_ride_with_their_text_also_when_text_was_held_back():
    events = [
        _chat_chunk(DeltaMessage(role="assistant", content="")),  # role chunk, no logprobs
        _chat_chunk(DeltaMessage(content="He"), [_entry("He", -0.1, [("Hi", -2.5)])], None, 1),
        # text held back (half a character, a possible stop string): logprobs, empty delta
        _chat_chunk(DeltaMessage(), [_entry("ll", -0.2, [("y", -3.0)])], None, 2),
        _chat_chunk(DeltaMessage(content="llo"), [_entry("o", -0.3, [("!", -1.5)])], None, 3),
        _chat_chunk(DeltaMessage(content=""), [_entry("<end>", -0.05)], "stop", 4),
    ]
    deltas = _deltas("chat", events)
    assert [(d.text, [e["token"] for e in d.logprobs]) for d in deltas] == [
        ("He", ["He"]),
        ("llo", ["ll", "o"]),
        ("", ["<end>"]),
    ]
    first = deltas[0].logprobs[0]
    assert first["logprob"] == -0.1 and first["bytes"] == [72, 101]
    assert [(t["token"], t["logprob"]) for t in first["top_logprobs"]] == [
        ("He", -0.1),
        ("Hi", -2.5),
    ]
    rendered = to_chat(deltas[1].logprobs)  # back into the chat shape, unchanged
    assert rendered == ChatCompletionLogProbs(
        content=[_entry("ll", -0.2, [("y", -3.0)]), _entry("o", -0.3, [("!", -1.5)])]
    ).model_dump(mode="json")


def test_chat_token_without_a_logprob_keeps_vllms_defaults():
    """vLLM builds an entry without logprob/top_logprobs for a step it has none for;
    exclude_unset leaves both out of the JSON."""
    bare = ChatCompletionLogProbsContent(token="x", bytes=[120])
    events = [_chat_chunk(DeltaMessage(content="x"), [bare], "stop", 1)]
    (delta,) = _deltas("chat", events)
    assert delta.logprobs == ({"token": "x", "logprob": None, "bytes": [120], "top_logprobs": []},)
    assert to_chat(delta.logprobs)["content"][0]["logprob"] == -9999.0


def test_completion_logprobs_and_text_offsets():
    tops = [{" a": -0.5, " b": -1.0}, {" c": -0.25, " d": -2.0}]
    events = [
        _completion_chunk(" a", [" a"], [-0.5], tops[:1], 0, None, 1),
        _completion_chunk("", [" c"], [-0.25], tops[1:], 2, None, 2),  # held back
        _completion_chunk(" c!", ["!"], [None], [None], 4, "length", 3),
    ]
    deltas = _deltas("completion", events)
    assert [d.text for d in deltas] == [" a", " c!"]
    assert deltas[1].finish_reason == "length" and deltas[1].completion_tokens == 3
    entries = [e for d in deltas for e in d.logprobs]
    assert to_completion(entries) == {
        "text_offset": [0, 2, 4],
        "token_logprobs": [-0.5, -0.25, None],
        "tokens": [" a", " c", "!"],
        "top_logprobs": [*tops, None],
    }
    assert to_completion(deltas[1].logprobs, offset=2)["text_offset"] == [2, 4]


def test_a_chat_continued_as_a_completion_keeps_its_top_logprobs():
    """After a migration a chat request continues as a token-id completion (whose form
    returns logprobs + 1 alternatives): it asks for top_logprobs, and they are trimmed."""
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": MSG, "logprobs": True, "top_logprobs": 1, "max_tokens": 8}
    )
    cont = Continuation("He", 1, token_ids=(10,), prompt_token_ids=(1, 2))
    request = EngineRequest("r", "chat", body, continuation=cont)
    kind, cbody = continuation_body(request)
    assert (kind, cbody.logprobs) == ("completion", 1)
    top = _chat_top(request, kind)
    events = [_completion_chunk("llo", ["llo"], [-0.3], [{"llo": -0.3, "y": -2.0}], 0, "stop", 1)]
    (delta,) = _deltas("completion", events, top)
    assert [t["token"] for t in delta.logprobs[0]["top_logprobs"]] == ["llo"]
    plain = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG})
    _, pbody = continuation_body(EngineRequest("r", "chat", plain, continuation=cont))
    assert pbody.logprobs is None  # not asked, not carried
    done = CompletionRequest.model_validate({"model": "m", "prompt": "a", "logprobs": 3})
    _, dbody = continuation_body(EngineRequest("r", "completion", done, continuation=cont))
    assert dbody.logprobs == 3

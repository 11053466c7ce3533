"""A non-stream response buffers at most MAX_BUFFERED_BYTES in the ingress
(serve/response_budget.py): n=8 with top_logprobs=20 at a long output is refused with a
clear 400 before any engine work, the same as a stream is served, and output that grows
past the cap anyway is cut off with the same error."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.admission.response_budget import (
    MAX_BUFFERED_BYTES,
    ResponseTooLargeError,
    buffer_cap,
    capped,
    worst_case_bytes,
)
from agentserve.api.ask import ask_of
from agentserve.engine.protocol import Delta
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

MSG = [{"role": "user", "content": "hello there"}]


def _chat(**extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **extra})


@pytest.mark.parametrize(
    ("kind", "body", "refused"),
    [
        ("chat", _chat(n=8, logprobs=True, top_logprobs=20, max_tokens=8192), True),
        # no limit set: not judged by the rest of the context (OpenAI takes logprobs without
        # max_tokens); cut off only if it does grow past the cap
        ("chat", _chat(n=8, logprobs=True, top_logprobs=20), False),
        ("chat", _chat(n=8, logprobs=True, top_logprobs=20, max_tokens=8192, stream=True), False),
        ("chat", _chat(n=8, max_tokens=8192), False),  # no logprobs: ~4 MiB
        ("chat", _chat(n=1, logprobs=True, top_logprobs=5, max_tokens=4096), False),
        (
            "completion",
            CompletionRequest(model="m", prompt="hi", n=8, logprobs=20, max_tokens=8000),
            True,
        ),
    ],
)
def test_worst_case_decides(kind, body, refused):
    if refused:
        with pytest.raises(ResponseTooLargeError) as caught:
            buffer_cap(ask_of(kind, body), 8192)
        assert caught.value.status == 400 and caught.value.code == "response_too_large"
        assert "stream: true" in caught.value.message
    else:
        assert buffer_cap(ask_of(kind, body), 8192) in (None, MAX_BUFFERED_BYTES)


def test_worst_case_counts_every_choice_and_logprob():
    one = worst_case_bytes(
        ask_of("chat", _chat(logprobs=True, top_logprobs=20, max_tokens=100)), None
    )
    eight = worst_case_bytes(
        ask_of("chat", _chat(n=8, logprobs=True, top_logprobs=20, max_tokens=100)), None
    )
    plain = worst_case_bytes(ask_of("chat", _chat(max_tokens=100)), None)
    assert eight == 8 * one and one > 20 * plain


def test_output_past_the_cap_is_cut_off():
    entry = {"token": "w", "logprob": -1.0, "bytes": None, "top_logprobs": [{}] * 20}

    async def deltas():
        for i in range(100):
            yield Delta("w ", 1, i + 1, logprobs=(entry,))

    async def run(cap):
        return [d async for d in capped(deltas(), cap)]

    assert len(asyncio.run(run(None))) == 100, "a stream is not capped"
    with pytest.raises(ResponseTooLargeError):
        asyncio.run(run(50_000))


def test_ingress_refuses_the_amplifying_request_before_the_engine_and_streams_it():
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 8192}]}
    )
    engine = FakeEngine("m", 8192)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})
    body = {"model": "m", "messages": MSG, "n": 8, "logprobs": True, "top_logprobs": 20}
    unlimited = asyncio.run(asgi_request(app, "POST", "/v1/chat/completions", body))
    assert unlimited.status == 200, "no output limit set: cut off only if it grows past the cap"
    engine.requests.clear()
    body["max_tokens"] = 8000
    call = asyncio.run(asgi_request(app, "POST", "/v1/chat/completions", body))
    assert call.status == 400, call.text()[:300]
    error = call.json()["error"]
    assert error["code"] == "response_too_large" and error["param"] == "n"
    assert len(engine.requests) == 0, "refused before any engine work"
    streamed = asyncio.run(
        asgi_request(app, "POST", "/v1/chat/completions", body | {"stream": True})
    )
    assert streamed.status == 200 and streamed.text().rstrip().endswith("data: [DONE]")

"""One benchmark request, three ways, for `agentserve bench overhead`: through the Engine
protocol, straight into vLLM's AsyncLLM, and over HTTP to the served app. Each returns the
request's timing as the caller saw it."""

from __future__ import annotations

import time
from typing import Any

from agentserve.engine.protocol import EngineRequest

from agentserve_bench.overhead_stats import OneRequest, RequestTiming

__all__ = [
    "async_llm_request_fn",
    "chat_body",
    "engine_request_fn",
    "http_request_fn",
    "prompt_ids",
]


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The OpenAI request both sides serve: greedy, fixed length, streamed with usage."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,  # vLLM's extension: every request generates max_tokens
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def engine_request_fn(engine: Any, model: str, max_tokens: int) -> OneRequest:
    """Bare side through the Engine protocol (the fake engine): parsed like the ingress
    parses, deltas carry cumulative token counts."""
    from agentserve.api.openai import parse_request  # imports vLLM's protocol: lazily

    async def one(request_id: str, prompt: str) -> RequestTiming:
        body = parse_request("chat", chat_body(model, prompt, max_tokens))
        start = time.perf_counter()
        first = last = None
        tokens = prompt_tokens = 0
        async for delta in engine.generate(EngineRequest(request_id, "chat", body)):
            if delta.completion_tokens > tokens:
                last = time.perf_counter()
                first = first or last
            tokens, prompt_tokens = delta.completion_tokens, delta.prompt_tokens
        return RequestTiming(start, first, last, tokens, prompt_tokens)

    return one


def prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of one user message as vLLM's chat serving renders it: the chat template
    as text with the generation prompt, tokenized without extra special tokens."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def async_llm_request_fn(llm: Any, tokenizer: Any, max_tokens: int) -> OneRequest:
    """Bare side on vLLM: AsyncLLM.generate on the chat template's token ids (what vLLM's
    chat serving renders), greedy, ignore_eos, delta outputs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )

    async def one(request_id: str, prompt: str) -> RequestTiming:
        ids = prompt_ids(tokenizer, prompt)
        start = time.perf_counter()
        first = last = None
        tokens = 0
        async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, request_id):
            new = len(out.outputs[0].token_ids)
            if new:
                last = time.perf_counter()
                first = first or last
                tokens += new
        return RequestTiming(start, first, last, tokens, len(ids))

    return one


def http_request_fn(client: Any, model: str, max_tokens: int) -> OneRequest:
    """Platform side: a streamed POST /v1/chat/completions (served_client.stream_chat) with
    ignore_eos; output times are the chunks carrying content, token counts come from the
    final usage chunk."""
    from agentserve_bench.served_client import stream_chat

    async def one(request_id: str, prompt: str) -> RequestTiming:
        messages = [{"role": "user", "content": prompt}]
        reply = await stream_chat(
            client, model, messages, max_tokens, headers={"x-request-id": request_id},
            extra={"ignore_eos": True},  # vLLM's extension: every request makes max_tokens
        )  # fmt: skip
        return RequestTiming(
            reply.start_s, reply.first_s, reply.last_s, reply.output_tokens, reply.prompt_tokens
        )

    return one

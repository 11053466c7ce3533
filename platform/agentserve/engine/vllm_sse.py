"""vLLM's OpenAI SSE stream (the serving layer's strings, with continuous usage and token
ids) as the platform's Deltas: what VLLMEngine.generate yields."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from agentserve.engine.logprobs import from_vllm, trim
from agentserve.engine.protocol import Delta, EngineError
from agentserve.engine.vllm_errors import error_from_payload

__all__ = ["deltas_from_sse"]


async def deltas_from_sse(
    kind: str, events: AsyncIterator[str], top_logprobs: int | None = None
) -> AsyncIterator[Delta]:
    """vLLM SSE strings (with continuous usage) -> Deltas; the finish delta comes last and
    carries the final token counts. An error event raises (4xx -> EngineRequestError).
    Token ids (return_token_ids) and log probabilities ride on the delta that delivers
    their text: those of chunks whose text vLLM held back wait for the next delta; the
    prompt's ids ride on the first, the prompt tokens the prefix cache served
    (`prompt_tokens_details.cached_tokens`) on the finish delta. `top_logprobs` trims each
    token's alternatives (a chat request continued as a completion, whose form has one
    more)."""
    prompt = output = cached = 0
    finish: Delta | None = None
    prompt_ids: tuple[int, ...] = ()
    pending: list[int] = []  # ids whose text is not yielded yet
    pending_lp: list[dict[str, Any]] = []  # and their log probabilities
    first = True
    async for event in events:
        for payload in _payloads(event):
            if "error" in payload:
                raise error_from_payload(payload)
            usage = payload.get("usage") or {}
            prompt = max(prompt, usage.get("prompt_tokens") or 0)
            output = max(output, usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}  # the final usage chunk's
            cached = max(cached, details.get("cached_tokens") or 0)
            prompt_ids = prompt_ids or tuple(payload.get("prompt_token_ids") or ())
            for choice in payload.get("choices") or []:
                prompt_ids = prompt_ids or tuple(choice.get("prompt_token_ids") or ())
                pending += choice.get("token_ids") or ()
                pending_lp += from_vllm(kind, choice.get("logprobs"))
                delta = _choice_delta(kind, choice, prompt, output)
                if delta.finish_reason is not None:
                    finish = delta
                elif delta.carries_output:
                    yield dataclasses.replace(
                        delta,
                        token_ids=tuple(pending),
                        prompt_token_ids=prompt_ids if first else (),
                        logprobs=_trimmed(pending_lp, top_logprobs),
                    )
                    pending, pending_lp, first = [], [], False
    if finish is None:
        raise EngineError("vLLM stream ended without a finish reason")
    yield Delta(
        finish.text,
        prompt,
        output,
        finish.finish_reason,
        finish.tool_calls,
        finish.reasoning,
        token_ids=tuple(pending),
        prompt_token_ids=prompt_ids if first else (),
        logprobs=_trimmed(pending_lp, top_logprobs),
        cached_tokens=cached,
    )


def _trimmed(entries: list[dict[str, Any]], top: int | None) -> tuple[dict[str, Any], ...]:
    return tuple(entries if top is None else trim(entries, top))


def _payloads(event: str) -> list[dict[str, Any]]:
    out = []
    for line in event.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            out.append(json.loads(line[6:]))
    return out


def _choice_delta(kind: str, choice: dict[str, Any], prompt: int, output: int) -> Delta:
    if kind == "chat":
        d = choice.get("delta") or {}
        return Delta(
            text=d.get("content") or "",
            prompt_tokens=prompt,
            completion_tokens=output,
            finish_reason=choice.get("finish_reason"),
            tool_calls=tuple(d.get("tool_calls") or ()),
            reasoning=d.get("reasoning") or d.get("reasoning_content") or "",
        )
    return Delta(choice.get("text") or "", prompt, output, choice.get("finish_reason"))

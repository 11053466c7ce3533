"""Bytes a non-stream response may buffer in the ingress: a request that sets an output
limit is refused (400) when its worst case is over the cap, and any request is cut off
(400) if its output grows past it anyway.

A non-stream answer is held whole in the ingress until it ends (the deltas, then the JSON
body). With n choices and top_logprobs each output token carries n x (1 + top_logprobs)
log-probability entries of a few hundred bytes as Python objects: n=8, top_logprobs=20
and 8K tokens buffered about 0.9 GB. Streams are not buffered and not capped.

The worst case: n x output limit (max_tokens, else the rest of the context) x
(BYTES_PER_TOKEN + BYTES_PER_LOGPROB x (1 + top logprobs) when logprobs are asked for).
Without a limit from the client the rest of the context is not what it expects (OpenAI
takes `logprobs` without `max_tokens`; on a 32K model top_logprobs 3 would be refused), so
such a request is only cut off if it does grow past the cap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from agentserve.admission.shares import prompt_estimates
from agentserve.api.ask import Ask
from agentserve.api.errors import InvalidRequestError
from agentserve.engine.protocol import Delta, aclose_stream

__all__ = ["MAX_BUFFERED_BYTES", "ResponseTooLargeError", "buffer_cap", "capped", "delta_bytes"]

MAX_BUFFERED_BYTES = 64 * 1024 * 1024
BYTES_PER_TOKEN = 64  # a token's text and its share of the delta objects
BYTES_PER_LOGPROB = 600  # one {"token", "logprob", "bytes"} entry as Python objects + JSON


class ResponseTooLargeError(InvalidRequestError):
    """400: the response would be, or became, too large to buffer."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param=param, code="response_too_large")


def worst_case_bytes(ask: Ask, context: int | None) -> int:
    """The most a non-stream response of `ask` can buffer (see the module docstring)."""
    limit = ask.output_limit
    per_token = BYTES_PER_TOKEN + BYTES_PER_LOGPROB * ask.logprobs_per_token
    total = 0
    for prompt in prompt_estimates(ask):  # a completion batch: each prompt's n
        out = max(1, (context or prompt + 1) - prompt) if limit is None else limit
        total += ask.n * out * per_token
    return total


def buffer_cap(ask: Ask, context: int | None, cap: int | None = None) -> int | None:
    """The byte cap for a non-stream request (None for a stream); ResponseTooLargeError
    when its worst case is over `cap` (default MAX_BUFFERED_BYTES)."""
    if ask.stream:
        return None
    cap = MAX_BUFFERED_BYTES if cap is None else cap
    if ask.output_limit is None:  # no limit to judge by: cut off at the cap if it gets there
        return cap
    worst = worst_case_bytes(ask, context)
    if worst > cap:
        batched = len(ask.prompts or ()) > 1
        param = "n" if ask.n > 1 else "max_tokens"
        raise ResponseTooLargeError(
            f"this non-stream request may produce about {worst // 2**20} MiB of response "
            f"({'prompts x ' if batched else ''}n x max_tokens x log probabilities), over "
            f"the {cap // 2**20} MiB a response is buffered; send stream: true, or "
            f"{'fewer prompts, ' if batched else ''}a smaller n, max_tokens or top_logprobs",
            param=param,
        )
    return cap


def delta_bytes(delta: Delta) -> int:
    """What `delta` holds, estimated as worst_case_bytes counts it."""
    size = len(delta.text) + len(delta.reasoning) + BYTES_PER_TOKEN
    for entry in delta.logprobs:
        top = entry.get("top_logprobs") if isinstance(entry, dict) else None
        size += BYTES_PER_LOGPROB * (1 + len(top or ()))
    return size


def capped(stream: AsyncIterator[Delta], cap: int | None) -> AsyncIterator[Delta]:
    """`stream`'s deltas; ResponseTooLargeError once they hold more than `cap` bytes
    (None: `stream` itself, a stream's deltas are not held)."""
    return stream if cap is None else _capped(stream, cap)


async def _capped(stream: AsyncIterator[Delta], cap: int) -> AsyncIterator[Delta]:
    held = 0
    try:
        async for delta in stream:
            held += delta_bytes(delta)
            if held > cap:
                raise ResponseTooLargeError(
                    f"the response grew past the {cap // 2**20} MiB a non-stream "
                    "response is buffered; send stream: true or a smaller max_tokens"
                )
            yield delta
    finally:
        await aclose_stream(stream)

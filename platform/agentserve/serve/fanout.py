"""n > 1: a request's choices run as n engine requests, merged into one stream.

Choice i is the request with n=1, request id `<id>-<i>` and, when the request has a
seed, seed + i (so a seeded request is reproducible, and choice 0 is what n=1 gives).
Each choice's stream is opened by the caller (through serve/migrate.py, so a choice
whose replica dies continues elsewhere on its own). The merged stream:
- waits for every choice's first delta before it yields anything, so an error of any
  choice before its first output is the whole request's error (a 4xx or 503 as for
  n=1), never a half-sent response;
- then yields deltas as they come, each with `index` = its choice, and with
  prompt_tokens the prompt's (once) and completion_tokens the request's running total
  (summed over choices), which is what usage and admission count;
- an error of one choice after that ends the whole stream with that error; closing the
  stream (the client went away, or an error) cancels and closes every choice's stream,
  which aborts them in their engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence

from agentserve.engine.protocol import Delta, EngineRequest, EngineUnavailableError, aclose_stream

__all__ = ["choice_requests", "fan_out"]

_SEED_MAX = 2**63 - 1

OpenStream = Callable[[EngineRequest], AsyncIterator[Delta]]


def choice_requests(request: EngineRequest) -> list[EngineRequest]:
    """The engine requests of `request`'s choices: [request] itself when n is 1 (pure)."""
    body = request.body
    n = getattr(body, "n", None) or 1
    if n == 1:
        return [request]
    seed = getattr(body, "seed", None)
    out = []
    for i in range(n):
        update: dict = {"n": 1}
        if seed is not None:
            update["seed"] = seed + i if seed + i <= _SEED_MAX else seed - i
        out.append(
            dataclasses.replace(
                request, request_id=f"{request.request_id}-{i}", body=body.model_copy(update=update)
            )
        )
    return out


def fan_out(request: EngineRequest, open_stream: OpenStream) -> AsyncIterator[Delta]:
    """`open_stream(request)` for n=1; else the merged stream of its choices (see above)."""
    requests = choice_requests(request)
    if len(requests) == 1:
        return open_stream(request)
    return _merged([open_stream(r) for r in requests])


async def _merged(streams: Sequence[AsyncIterator[Delta]]) -> AsyncIterator[Delta]:
    tokens = [0] * len(streams)  # each choice's completion tokens so far
    finished: dict[int, int] = {}  # choice -> the cached prompt tokens its finish reported
    prompt = 0
    running: dict[asyncio.Future, int] = {}

    def counted(i: int, delta: Delta) -> Delta:
        nonlocal prompt
        tokens[i] = max(tokens[i], delta.completion_tokens)
        prompt = max(prompt, delta.prompt_tokens)
        # the prompt's cached tokens: the fewest any choice found (the others find blocks
        # a sibling just prefilled, which the request's usage must not count as cached)
        if delta.finish_reason is not None:
            finished[i] = delta.cached_tokens
        cached = min(finished.values()) if len(finished) == len(streams) else 0
        return dataclasses.replace(
            delta,
            index=i,
            prompt_tokens=prompt,
            completion_tokens=sum(tokens),
            cached_tokens=cached,
        )

    def next_of(i: int) -> None:
        running[asyncio.ensure_future(anext(streams[i]))] = i

    try:
        for i in range(len(streams)):
            next_of(i)
        await asyncio.wait(running, return_when=asyncio.FIRST_EXCEPTION)
        for future, i in sorted(running.items(), key=lambda item: item[1]):
            if future.done() and future.exception() is not None:
                error = future.exception()
                if isinstance(error, StopAsyncIteration):
                    raise EngineUnavailableError(
                        f"the engine ended choice {i} without output"
                    ) from None
                raise error
        firsts = [f.result() for f, _ in sorted(running.items(), key=lambda item: item[1])]
        running.clear()
        for i, delta in enumerate(firsts):
            yield counted(i, delta)
            if delta.finish_reason is None:
                next_of(i)
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=running.__getitem__):
                i = running.pop(future)
                try:
                    delta = future.result()
                except StopAsyncIteration:  # ended without a finish delta: nothing more
                    continue
                yield counted(i, delta)
                if delta.finish_reason is None:
                    next_of(i)
    finally:
        for future in running:
            future.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for stream in streams:
            await aclose_stream(stream)

"""n > 1 or a completion batch: a request's choices run as engine requests of their own
(prompts x n; api/prompts.py), merged into one stream.

Choice i = p * n + j (prompt p's choice j) is the request with n=1, that prompt alone,
request id `<id>-<i>` and, when the request has a seed, seed + j (so a seeded request is
reproducible, and each prompt's choice 0 is what that prompt alone with n=1 gives).
Each choice's stream is opened by the caller (through serve/migrate.py, so a choice
whose replica dies continues elsewhere on its own). The merged stream:
- waits for every choice's first delta before it yields anything, so an error of any
  choice before its first output is the whole request's error (a 4xx or 503 as for
  n=1), never a half-sent response;
- then yields deltas as they come, each with `index` = its choice, and with
  prompt_tokens the prompts' (each once) and completion_tokens the request's running total
  (summed over choices), which is what usage and admission count;
- an error of one choice after that ends the whole stream with that error; closing the
  stream (the client went away, or an error) cancels and closes every choice's stream,
  which aborts them in their engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence

from agentserve.api.prompts import prompts_of
from agentserve.engine.protocol import Delta, EngineRequest, EngineUnavailableError, aclose_stream

__all__ = ["choice_requests", "fan_out"]

_SEED_MAX = 2**63 - 1

OpenStream = Callable[[EngineRequest], AsyncIterator[Delta]]


def choice_requests(request: EngineRequest) -> list[EngineRequest]:
    """The engine requests of `request`'s choices: [request] itself when it has one
    (pure; a batch of one prompt unwrapped to that prompt). Choice p * n + j is prompt p's
    choice j (a completion batch, api/prompts.py)."""
    body = request.body
    n = body.n or 1
    prompts = prompts_of(request.kind, body)
    if n == 1 and (prompts is None or len(prompts) <= 1):
        if prompts and prompts[0] is not body.prompt:  # a batch of one: its prompt alone
            return [
                dataclasses.replace(request, body=body.model_copy(update={"prompt": prompts[0]}))
            ]
        return [request]
    seed = body.seed
    out = []
    for p, prompt in enumerate(prompts or [None]):
        for j in range(n):
            update: dict = {"n": 1}
            if prompt is not None and prompt is not body.prompt:
                update["prompt"] = prompt
            if seed is not None:
                update["seed"] = seed + j if seed + j <= _SEED_MAX else seed - j
            out.append(
                dataclasses.replace(
                    request,
                    request_id=f"{request.request_id}-{p * n + j}",
                    body=body.model_copy(update=update),
                )
            )
    return out


def fan_out(request: EngineRequest, open_stream: OpenStream) -> AsyncIterator[Delta]:
    """`open_stream(request)` for one choice; else the merged stream of its choices."""
    requests = choice_requests(request)
    if len(requests) == 1:
        return open_stream(request)
    n = request.body.n or 1
    return _merged([open_stream(r) for r in requests], [i // n for i in range(len(requests))])


async def _merged(
    streams: Sequence[AsyncIterator[Delta]], prompt_of: Sequence[int]
) -> AsyncIterator[Delta]:
    """`prompt_of[i]`: the prompt choice i answers (0 for every choice but in a batch)."""
    tokens = [0] * len(streams)  # each choice's completion tokens so far
    finished: dict[int, int] = {}  # choice -> the cached prompt tokens its finish reported
    prompts: dict[int, int] = {}  # prompt -> its tokens (every choice of it reports them)
    running: dict[asyncio.Future, int] = {}

    def cached_total() -> int:
        """Each prompt's cached tokens: the fewest any of its choices found (the others
        find blocks a sibling just prefilled, which usage must not count as cached)."""
        if len(finished) < len(streams):
            return 0
        fewest: dict[int, int] = {}
        for i, cached in finished.items():
            fewest[prompt_of[i]] = min(fewest.get(prompt_of[i], cached), cached)
        return sum(fewest.values())

    def counted(i: int, delta: Delta) -> Delta:
        tokens[i] = max(tokens[i], delta.completion_tokens)
        prompts[prompt_of[i]] = max(prompts.get(prompt_of[i], 0), delta.prompt_tokens)
        if delta.finish_reason is not None:
            finished[i] = delta.cached_tokens
        return dataclasses.replace(
            delta,
            index=i,
            prompt_tokens=sum(prompts.values()),
            completion_tokens=sum(tokens),
            cached_tokens=cached_total(),
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

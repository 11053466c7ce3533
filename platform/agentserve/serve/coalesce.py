"""Stream coalescing: what one replica sends its ingress per message.

Every message on the way to the client (replica -> ingress over a Ray Serve handle,
ingress -> Serve proxy, proxy -> HTTP) wakes a process and costs CPU that the engine's
own threads would otherwise get; at one token per engine step that is three wake-ups per
token per stream. `coalesced` sends the first delta at once (time to first token is not
delayed), then at most one message per `interval_s`: each carries every delta produced
since the last, merged into as few deltas as keep the stream's meaning (`merge_deltas`),
so the ingress also writes one SSE event for them. A stream's end is sent as soon as it
comes. Token timing inside a message is lost to the client; the replica's own statistics
and spans (TTFT, TPOT, per-step speculation figures) are taken before coalescing.
Ray Serve LLM batches its streams the same way (every 50 ms by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable

from agentserve.engine.protocol import Delta, aclose_stream

__all__ = ["coalesced", "merge_deltas"]

_END = object()


def merge_deltas(deltas: Iterable[Delta]) -> list[Delta]:
    """Consecutive deltas of one choice as few deltas: text, reasoning, token ids and
    log probabilities concatenate, counts are the last delta's (they are cumulative), the
    prompt's ids stay on the first. A delta with tool calls or a finish reason is never
    merged into another (a client accumulates tool-call fragments by position), nor are
    deltas of different choices."""
    out: list[Delta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if last is None or not _mergeable(last, delta):
            out.append(delta)
            continue
        out[-1] = dataclasses.replace(
            last,
            text=last.text + delta.text,
            reasoning=last.reasoning + delta.reasoning,
            prompt_tokens=delta.prompt_tokens,
            completion_tokens=delta.completion_tokens,
            token_ids=last.token_ids + delta.token_ids,
            logprobs=last.logprobs + delta.logprobs,
        )
    return out


def _mergeable(a: Delta, b: Delta) -> bool:
    return (
        a.index == b.index
        and a.finish_reason is None
        and b.finish_reason is None
        and not a.tool_calls
        and not b.tool_calls
    )


async def coalesced(stream: AsyncIterator[Delta], interval_s: float) -> AsyncIterator[list[Delta]]:
    """`stream`'s deltas as lists: the first alone and at once, then what arrived in each
    `interval_s` (merged), the last list as soon as the stream ends. With interval_s <= 0,
    one list per delta. Closing this iterator closes `stream` (the engine aborts); an
    error of `stream` is raised after the deltas that came before it."""
    if interval_s <= 0:
        async for delta in stream:
            yield [delta]
        return
    items: deque = deque()
    arrived, ended = asyncio.Event(), asyncio.Event()

    async def pump() -> None:
        try:
            async for delta in stream:
                items.append(delta)
                arrived.set()
        except Exception as err:  # raised to the reader in order, after what came before
            items.append(err)
        finally:
            items.append(_END)
            ended.set()
            arrived.set()

    task = asyncio.get_running_loop().create_task(pump())
    try:
        sent_at: float | None = None
        while True:
            await arrived.wait()
            if sent_at is not None and not ended.is_set():  # later deltas wait their turn
                left = sent_at + interval_s - time.monotonic()
                if left > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ended.wait(), left)  # the end is not held
            arrived.clear()
            batch: list[Delta] = []
            while items and not (items[0] is _END or isinstance(items[0], Exception)):
                batch.append(items.popleft())
            if batch:
                sent_at = time.monotonic()
                yield merge_deltas(batch)
            if items and isinstance(items[0], Exception):
                raise items[0]
            if items and items[0] is _END:
                return
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await aclose_stream(stream)

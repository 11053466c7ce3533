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

The interval follows the load (`stream_interval_s`): with n streams open on a replica each
waits n intervals, up to a cap, so the replica's messages per second stay about the same
whether one client streams or four, and the engine's threads keep the cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable

from agentserve.engine.protocol import Delta, aclose_stream

__all__ = ["coalesced", "merge_deltas", "stream_interval_s"]

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


def stream_interval_s(interval_ms: float, max_ms: float, streams: int) -> float:
    """Seconds between one stream's messages while `streams` are open on its replica:
    interval_ms per open stream, at most max_ms, never below interval_ms (0: every delta
    at once)."""
    return max(interval_ms, min(max_ms, interval_ms * max(1, streams))) / 1000


def _mergeable(a: Delta, b: Delta) -> bool:
    return (
        a.index == b.index
        and a.finish_reason is None
        and b.finish_reason is None
        and not a.tool_calls
        and not b.tool_calls
    )


async def coalesced(
    stream: AsyncIterator[Delta], interval_s: float | Callable[[], float]
) -> AsyncIterator[list[Delta]]:
    """`stream`'s deltas as lists: the first alone and at once, then what arrived in each
    `interval_s` (merged), the last list as soon as the stream ends; a callable interval
    is asked again before each wait. With an interval <= 0, one list per delta. Closing
    this iterator closes `stream` (the engine aborts); an error of `stream` is raised
    after the deltas that came before it."""
    interval = interval_s if callable(interval_s) else lambda: interval_s
    if interval() <= 0:
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
                left = sent_at + interval() - time.monotonic()
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

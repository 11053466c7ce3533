"""Streams and clients that stop reading: a stream's output is produced only as fast as its
client takes it, and a client that takes nothing for server.stream_stall_timeout_s ends it.

`GuardedStream` is the StreamingResponse of the SSE path (serve/ingress.py). Starlette
pulls the next frame from the request path (and the path the next delta from the engine
stream) only after the server has accepted the last one, so where the server applies flow
control (its send waits while the connection's buffers are full) a client that stops
reading stops the path: the ingress holds one frame of such a stream, not its output so
far. A send still waiting after `stall_s` ends the response: the path is closed (its close
stage aborts the generation and records the request as 499), nothing more is sent and the
server drops the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping

from fastapi.responses import StreamingResponse
from starlette.types import Message, Send

__all__ = ["GuardedStream"]

log = logging.getLogger("agentserve.serve.ingress")


class _Stalled(Exception):
    """The client took nothing for the stall limit."""


class GuardedStream(StreamingResponse):
    """A StreamingResponse whose every send must complete within `stall_s` seconds; past
    it the body iterator is closed (aclose) and the response ends without its last
    message."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        stall_s: float,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ):
        super().__init__(content, headers=headers, media_type=media_type)
        self.stall_s = stall_s

    async def stream_response(self, send: Send) -> None:
        async def timed(message: Message) -> None:
            try:
                async with asyncio.timeout(self.stall_s):
                    await send(message)
            except TimeoutError:
                raise _Stalled from None

        try:
            await super().stream_response(timed)
        except _Stalled:
            log.warning(
                "a stream's client took no output for %g s (server.stream_stall_timeout_s): "
                "stream ended, generation aborted",
                self.stall_s,
            )
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:  # the path's close stage runs now, not at GC
                await aclose()

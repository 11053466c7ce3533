"""6. stream: an admitted request's deltas as its client asked for them, one JSON body or
SSE frames, in the shape of its API (chat or text completion: api/openai.py and
api/sse.py; /v1/responses: api/responses_render.py).

A JSON answer is collected whole (a client that goes away first aborts the generation:
499). A stream sends its frames as they come; an engine error after its 200 header is
reported in-band, OpenAI style. Either way the request's outcome is set on `Held`; the
close stage (serve/stages.py) ends the engine stream and records it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from agentserve.api.ask import Ask
from agentserve.api.errors import error_body
from agentserve.api.openai import ResponseBuilder
from agentserve.api.responses import ResponsesRequest
from agentserve.api.responses_render import ResponsesBuilder
from agentserve.api.sse import ChatFrames
from agentserve.engine.protocol import Delta, EngineError
from agentserve.serve.stages import CLIENT_CLOSED, Held, status_of

__all__ = ["Reply"]

log = logging.getLogger("agentserve.serve.ingress")


class Reply:
    """The answer to one request whose first delta has come (`held.stream` has the rest);
    `see(delta)` counts each delta for admission (admission/admit.py Admit.see)."""

    def __init__(
        self,
        ask: Ask,
        request_id: str,
        request: Request,
        responses: ResponsesRequest | None,
        held: Held,
        see: Callable[[Delta], None],
    ):
        adapter = held.call.adapter if held.call is not None else None
        model = adapter or ask.model  # as vLLM answers: the adapter's name
        if responses is not None:
            builder = ResponsesBuilder(request_id, model, responses.echo)
            self.frames: ChatFrames | ResponsesBuilder = builder
        else:
            builder = ResponseBuilder(ask.kind, request_id, model, ask.include_usage, ask.choices)
            self.frames = ChatFrames(builder)
        self.builder: ResponseBuilder | ResponsesBuilder = builder
        self.headers = {"x-request-id": request.headers.get("x-request-id", builder.id)}
        self.request, self.held, self.see = request, held, see

    async def json(self, first: Delta) -> Response:
        """The whole answer; an engine error raises (the app renders it as JSON)."""
        deltas = await self._collect(first)
        if deltas is None:  # the client went away: generation aborted
            self.held.finish(CLIENT_CLOSED)
            return Response(status_code=CLIENT_CLOSED)
        answer = JSONResponse(self.builder.final(deltas), headers=self.headers)
        self.held.finish(200)
        return answer

    async def sse(self, first: Delta) -> AsyncIterator[bytes]:
        """SSE bytes: the frames' start, one frame per delta, their end."""
        frames, call = self.frames, self.held.call
        try:
            for frame in (frames.start(), frames.delta(first)):
                if frame:
                    yield frame
            async for delta in self.held.stream:
                self.see(delta)
                if frame := frames.delta(delta):
                    yield frame
            yield frames.end(call.prompt_tokens, call.completion_tokens, call.cached_tokens)
            self.held.finish(200)
        except EngineError as err:  # after the 200 header: report in-band, OpenAI style
            self.held.finish(status_of(err))
            yield frames.error(error_body(err, self.headers["x-request-id"]))
        except Exception:  # a bug mid-stream: still end the stream with an error event
            request_id = self.headers["x-request-id"]
            log.exception("request %s: unhandled error in a stream", request_id)
            self.held.finish(500)
            yield frames.error(error_body(RuntimeError(), request_id))

    async def _collect(self, first: Delta) -> list[Delta] | None:
        """All deltas of a non-stream request; None when its client disconnects first
        (the generation is then cancelled, which aborts it in the engine)."""
        deltas = [first]

        async def drain() -> None:
            async for delta in self.held.stream:
                self.see(delta)
                deltas.append(delta)

        drained = asyncio.ensure_future(drain())
        gone = asyncio.ensure_future(_client_gone(self.request))
        try:
            await asyncio.wait({drained, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (drained, gone):
                task.cancel()
            await asyncio.gather(drained, gone, return_exceptions=True)
        if drained.cancelled():
            return None
        drained.result()  # an engine error is raised here
        return deltas


async def _client_gone(request: Request) -> None:
    """Returns once the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass

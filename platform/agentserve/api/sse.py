"""Server-sent events framing for OpenAI streams: `data: <json>\n\n`, then `data: [DONE]`.

The ingress writes a stream through a frames object: start() before the first delta,
delta(d) for each delta, end(prompt_tokens, output_tokens, cached_tokens) after the last,
error(body) for a failure mid-stream; each returns bytes (b"": nothing to write). ChatFrames
does this for chat and text completions; api/responses_render.ResponsesBuilder for Responses.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE", "ChatFrames", "sse_event"]

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying `payload` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"


class ChatFrames:
    """A chat or completion stream (api/openai.ResponseBuilder's chunks): role chunk,
    one chunk per delta, the usage chunk when asked for, [DONE]."""

    def __init__(self, builder: Any):
        self.builder = builder

    def start(self) -> bytes:
        opening = self.builder.first_chunk()
        return b"" if opening is None else sse_event(opening)

    def delta(self, delta: Any) -> bytes:
        return sse_event(self.builder.chunk(delta))

    def end(self, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> bytes:
        if not self.builder.include_usage:
            return DONE
        usage = self.builder.usage_chunk(prompt_tokens, output_tokens, cached_tokens)
        return sse_event(usage) + DONE

    def error(self, body: dict[str, Any]) -> bytes:
        return sse_event(body)

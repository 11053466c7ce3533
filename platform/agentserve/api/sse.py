"""Server-sent events framing for OpenAI streams: `data: <json>\n\n`, then `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE", "sse_event"]

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying `payload` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"

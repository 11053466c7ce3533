"""Drive an ASGI app directly on the test's event loop (no server, no client library), so a
test sees when each response message is sent and controls when the client goes away."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Call:
    """One request's response as the app sent it: (monotonic time, ASGI message) pairs."""

    sent: list[tuple[float, dict]] = field(default_factory=list)

    @property
    def status(self) -> int | None:
        starts = [m for _, m in self.sent if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def headers(self) -> dict[str, str]:
        starts = [m for _, m in self.sent if m["type"] == "http.response.start"]
        return {k.decode(): v.decode() for k, v in (starts[0]["headers"] if starts else [])}

    def body_times(self) -> list[float]:
        """Times of the non-empty body messages (one per SSE event for a stream)."""
        return [t for t, m in self.sent if m["type"] == "http.response.body" and m.get("body")]

    def text(self) -> str:
        return b"".join(m.get("body", b"") for _, m in self.sent if "body" in m).decode()

    def json(self) -> Any:
        return json.loads(self.text())


async def asgi_request(
    app: Any,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    *,
    headers: dict[str, str] | None = None,
    disconnect: asyncio.Event | None = None,
    call: Call | None = None,
    trickle_s: float | None = None,
    reads: int | None = None,
) -> Call:
    """Send one HTTP request to `app`; `disconnect` set = the client goes away (the app's
    next receive() returns http.disconnect). A dict body is sent as JSON; with `trickle_s`
    one byte at a time, `trickle_s` apart (a slow client). `reads`: the client takes that
    many body messages, then reads no more (the app's next send waits for ever)."""
    call = call or Call()
    raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    sent_headers = {"host": "127.0.0.1:8000", "content-length": str(len(raw))}
    if isinstance(body, dict):
        sent_headers["content-type"] = "application/json"
    sent_headers.update({k.lower(): v for k, v in (headers or {}).items()})
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in sent_headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    gone = disconnect or asyncio.Event()
    pending = [{"type": "http.request", "body": raw, "more_body": False}]
    if trickle_s is not None:
        last = len(raw) - 1
        pending = [
            {"type": "http.request", "body": raw[i : i + 1], "more_body": i < last}
            for i in range(len(raw))
        ][::-1]

    async def receive() -> dict:
        if pending:
            if trickle_s is not None and len(pending) <= last:
                await asyncio.sleep(trickle_s)
            return pending.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        bodies = sum(1 for _, m in call.sent if m["type"] == "http.response.body")
        if reads is not None and message["type"] == "http.response.body" and bodies >= reads:
            await asyncio.Event().wait()  # a client that stopped reading
        call.sent.append((time.monotonic(), message))
        if message["type"] == "http.response.body" and not message.get("more_body"):
            gone.set()  # the response is complete: the connection closes

    await app(scope, receive, send)
    return call

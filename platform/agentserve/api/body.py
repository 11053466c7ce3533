"""Read a request body as JSON within a size limit: 413 past the limit, 400 for anything
that is not a JSON document (bad UTF-8, bad syntax, nesting past Python's recursion limit,
integers past Python's digit limit).

The declared Content-Length is checked before anything is read; a body without one
(chunked) is counted while it streams, so no more than `max_bytes` is ever held. A client
that leaves while sending it is a 499 (ClientClosedError), not a server error; one that does
not finish sending it within `timeout_s` is a 408 (RequestTimeoutError), so a trickling
client cannot hold an ingress slot for longer than that.
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import ClientDisconnect, Request

from agentserve.api.errors import (
    ClientClosedError,
    InvalidRequestError,
    RequestTimeoutError,
    RequestTooLargeError,
)

__all__ = ["decode_json", "read_body"]


async def read_body(request: Request, max_bytes: int, timeout_s: float | None = None) -> bytes:
    """The raw body, at most `max_bytes`; RequestTooLargeError (413) past it,
    RequestTimeoutError (408) when the whole body has not come within `timeout_s` (None:
    no deadline)."""
    if timeout_s is None:
        return await _read_bounded(request, max_bytes)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_bounded(request, max_bytes)
    except TimeoutError:
        raise RequestTimeoutError(
            f"The request body was not received within {timeout_s:g} s "
            "(server.body_read_timeout_s); send it at once."
        ) from None


async def _read_bounded(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(size, max_bytes, at_least=True)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientClosedError("The client left while sending the body.") from None
    return b"".join(chunks)


def _too_large(size: int, max_bytes: int, *, at_least: bool = False) -> RequestTooLargeError:
    more = "at least " if at_least else ""
    return RequestTooLargeError(
        f"The request body is {more}{size} bytes; this server accepts at most {max_bytes} "
        "bytes (server.max_request_body_bytes)."
    )


def decode_json(raw: bytes) -> object:
    """bytes -> JSON value, or InvalidRequestError naming what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidRequestError(
            f"The request body is not valid UTF-8: byte 0x{raw[err.start]:02x} at offset "
            f"{err.start} ({err.reason})."
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidRequestError(
            f"The request body is not valid JSON: {err.msg} at line {err.lineno} column "
            f"{err.colno}."
        ) from None
    except RecursionError:
        raise InvalidRequestError("The request body is not valid JSON: nested too deep.") from None
    except ValueError as err:  # e.g. an integer literal past sys.get_int_max_str_digits()
        raise InvalidRequestError(f"The request body is not valid JSON: {err}") from None

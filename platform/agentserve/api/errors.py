"""OpenAI error objects: one exception type per HTTP status we return, their JSON body, the
body of any other error the ingress meets, and the app's exception handlers.

Body shape (OpenAI): {"error": {"message", "type", "param", "code"}}. Client mistakes are
4xx; only bugs become 500. Client errors (ours, and the engine's 4xx) keep their status and
message. An engine that is unavailable (503) or any other error (500) gets a generic
message with a request id: Ray's and the engine's own text (hosts, pids, stack details)
is logged under that id, never sent.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from agentserve.engine.protocol import EngineRequestError, EngineUnavailableError

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "APIError",
    "AuthenticationError",
    "ClientClosedError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "OverloadedError",
    "RateLimitError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "error_body",
    "install_error_handlers",
    "request_id_of",
]

log = logging.getLogger("agentserve.serve.ingress")


class APIError(Exception):
    """An error with an HTTP status and an OpenAI error body."""

    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        message, param = _printable(message), param and _printable(param)
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        """Extra response headers."""
        return {}


def _printable(text: str) -> str:
    """`text` with anything UTF-8 cannot encode (unpaired surrogates echoed from a
    request) escaped, so the error body always renders."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class InvalidRequestError(APIError):
    """400: malformed body, invalid parameter, or prompt longer than the context."""

    status = 400
    type = "invalid_request_error"


class RequestTooLargeError(APIError):
    """413: the request body is larger than server.max_request_body_bytes."""

    status = 413
    type = "invalid_request_error"

    def __init__(self, message: str):
        super().__init__(message, code="request_too_large")


class RequestTimeoutError(APIError):
    """408: the client did not send its whole request body within
    server.body_read_timeout_s."""

    status = 408
    type = "invalid_request_error"

    def __init__(self, message: str):
        super().__init__(message, code="request_timeout")


class AuthenticationError(APIError):
    """401: missing or unknown API key."""

    status = 401
    type = "invalid_request_error"

    def __init__(self, message: str = "Incorrect or missing API key.", **kwargs: Any):
        super().__init__(message, code=kwargs.pop("code", "invalid_api_key"), **kwargs)

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class ModelNotFoundError(APIError):
    """404: the request names a model this deployment does not serve."""

    status = 404
    type = "invalid_request_error"

    def __init__(self, model: str, served: list[str]):
        super().__init__(
            f"The model {model!r} does not exist; served models: {', '.join(served)}",
            param="model",
            code="model_not_found",
        )


class ClientClosedError(APIError):
    """499 (nginx's "client closed the request"): the client went away before its request
    was read; recorded as such, with nobody left to answer."""

    status = 499
    type = "client_closed_request"


class RateLimitError(APIError):
    """429: the tenant is over one of its limits; `retry_after_s` says when to retry."""

    status = 429
    type = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, code: str | None = None):
        super().__init__(message, code=code or "rate_limit_exceeded")
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class OverloadedError(APIError):
    """503: the model's queue is full or no replica can serve now."""

    status = 503
    type = "server_overloaded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0):
        super().__init__(message, code="overloaded")
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


def error_body(err: Exception, request_id: str | None = None) -> dict:
    """The OpenAI error object for `err`. An unavailable engine (503) or anything
    unexpected (500) gets a generic message naming `request_id` (default: a new one), and
    its own text is logged under that id."""
    if isinstance(err, APIError):
        return err.body()
    if isinstance(err, EngineRequestError):
        return _body(err.message, err.type, err.param, err.code)
    request_id = request_id or uuid.uuid4().hex
    if isinstance(err, EngineUnavailableError):
        log.warning("request %s: model unavailable: %s", request_id, err)
        message = f"the model is unavailable right now; retry later (request id {request_id})"
        return OverloadedError(message).body()
    log.error("request %s failed: %r", request_id, err)
    return _body(f"internal server error (request id {request_id})", "server_error")


def request_id_of(headers: Any) -> str:
    """The client's x-request-id (printable, at most 128 characters) or a new id."""
    given = headers.get("x-request-id") if headers is not None else None
    if isinstance(given, str) and 0 < len(given) <= 128 and given.isprintable():
        return given
    return uuid.uuid4().hex


def _body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def install_error_handlers(app: FastAPI) -> None:
    """JSON error responses for every error a route can raise."""
    # imported here: the error types above serve the operator and pure modules too
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @app.exception_handler(EngineRequestError)
    async def _engine_request_error(_: Request, err: EngineRequestError) -> JSONResponse:
        return JSONResponse(error_body(err), status_code=err.status)

    @app.exception_handler(EngineUnavailableError)
    async def _unavailable(request: Request, err: EngineUnavailableError) -> JSONResponse:
        request_id = request_id_of(request.headers)
        headers = {"Retry-After": "1", "x-request-id": request_id}
        return JSONResponse(error_body(err, request_id), status_code=503, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        body = _body(str(err.detail), "invalid_request_error")
        return JSONResponse(body, status_code=err.status_code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception) -> JSONResponse:
        request_id = request_id_of(request.headers)
        log.exception("request %s: unhandled error", request_id, exc_info=err)
        body = error_body(err, request_id)
        return JSONResponse(body, status_code=500, headers={"x-request-id": request_id})

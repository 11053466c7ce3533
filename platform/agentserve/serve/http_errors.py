"""OpenAI error bodies for errors the ingress meets, and the app's exception handlers:
client and engine errors keep their status and message; anything else is a 500 whose
body names no internal detail (the detail is logged)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentserve.api.errors import APIError, OverloadedError
from agentserve.engine.protocol import EngineRequestError, EngineUnavailableError

__all__ = ["error_body", "install_error_handlers"]

log = logging.getLogger("agentserve.serve.ingress")


def error_body(err: Exception) -> dict:
    """The OpenAI error object for `err`; a generic server_error for anything unexpected."""
    if isinstance(err, APIError):
        return err.body()
    if isinstance(err, EngineRequestError):
        return {
            "error": {
                "message": err.message,
                "type": err.type,
                "param": err.param,
                "code": err.code,
            }
        }
    if isinstance(err, EngineUnavailableError):
        return OverloadedError(str(err) or "the model is unavailable").body()
    return {
        "error": {
            "message": "internal server error",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


def install_error_handlers(app: FastAPI) -> None:
    """JSON error responses for every error a route can raise."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @app.exception_handler(EngineRequestError)
    async def _engine_request_error(_: Request, err: EngineRequestError) -> JSONResponse:
        return JSONResponse(error_body(err), status_code=err.status)

    @app.exception_handler(EngineUnavailableError)
    async def _unavailable(_: Request, err: EngineUnavailableError) -> JSONResponse:
        return JSONResponse(error_body(err), status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        body = {
            "error": {
                "message": str(err.detail),
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        return JSONResponse(body, status_code=err.status_code)

    @app.exception_handler(Exception)
    async def _bug(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error in request", exc_info=err)
        return JSONResponse(error_body(err), status_code=500)

"""vLLM's errors -> engine errors (engine/protocol.py): its client errors become 4xx (with
OpenAI's `context_length_exceeded` code), an unavailable engine 503, the rest 500."""

from __future__ import annotations

from typing import Any

from agentserve.engine.protocol import EngineError, EngineRequestError, EngineUnavailableError

__all__ = ["error_from_payload", "request_error_from_vllm"]


def request_error_from_vllm(err: BaseException) -> EngineRequestError | None:
    """vLLM raises its client errors (a prompt past the context, a bad parameter) out of
    the serving layer rather than returning them: map them to a 4xx, not a 500."""
    names = {cls.__name__ for cls in type(err).__mro__}
    if "VLLMClientError" not in names:
        return None
    message = str(err.args[0]) if err.args else str(err)  # without vLLM's "(parameter=...)"
    status = 404 if "VLLMNotFoundError" in names else 400
    context = "context length" in message
    return EngineRequestError(
        message,
        status=status,
        type="invalid_request_error" if status == 400 else "not_found_error",
        param=None if context else getattr(err, "parameter", None),
        code="context_length_exceeded" if context else None,
    )


def error_from_payload(payload: dict[str, Any]) -> EngineError:
    """An OpenAI error body (vLLM's error response or SSE error event) -> the engine error:
    4xx -> EngineRequestError with OpenAI's error type (vLLM's payloads carry its exception
    names), 501 -> a 400 (unsupported), 503 -> EngineUnavailableError, else EngineError."""
    error = payload.get("error") or {}
    status = error.get("code") if isinstance(error.get("code"), int) else 500
    message = error.get("message") or "vLLM error"
    if status == 501:  # a feature this build does not implement: the request's doing
        return EngineRequestError(
            message, status=400, type="invalid_request_error", code="unsupported_parameter"
        )
    if 400 <= status < 500:  # vLLM's type names (BadRequestError...) -> OpenAI's
        code = "context_length_exceeded" if "context length" in message else None
        return EngineRequestError(
            message,
            status=status,
            type="not_found_error" if status == 404 else "invalid_request_error",
            param=error.get("param"),
            code=code,
        )
    if status == 503:
        return EngineUnavailableError(message)
    return EngineError(message)

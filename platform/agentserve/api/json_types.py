"""The JSON types of the top-level request fields, as OpenAI's API checks them: vLLM's
protocol models validate in pydantic's lax mode, which takes `true` for `n` or
`max_tokens` (1), `"1"` for `seed` and `"yes"` for `stream`; OpenAI answers those with a
400, and so does this check, naming the field, before the protocol model runs.
"""

from __future__ import annotations

from typing import Any

from agentserve.api.errors import InvalidRequestError

__all__ = ["check_json_types"]

_INT = "an integer"
_NUMBER = "a number"
_BOOL = "a boolean"

_COMMON = {
    "n": _INT,
    "max_tokens": _INT,
    "seed": _INT,
    "min_tokens": _INT,
    "top_k": _INT,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "min_p": _NUMBER,
    "presence_penalty": _NUMBER,
    "frequency_penalty": _NUMBER,
    "repetition_penalty": _NUMBER,
    "stream": _BOOL,
}
# field -> the JSON type it must have, per endpoint (null always passes: "not set")
FIELD_TYPES: dict[str, dict[str, str]] = {
    "chat": {
        **_COMMON,
        "max_completion_tokens": _INT,
        "top_logprobs": _INT,
        "logprobs": _BOOL,
        "parallel_tool_calls": _BOOL,
    },
    "completion": {**_COMMON, "logprobs": _INT, "echo": _BOOL, "best_of": _INT},
}


_JSON_NAMES = {bool: "boolean", str: "string", list: "array", dict: "object"}


def _fits(value: Any, kind: str) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    # a number (a whole one for _INT: 2.5 is left to the protocol model's own message)
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_json_types(kind: str, data: dict[str, Any]) -> None:
    """InvalidRequestError (400) naming the first top-level field of the wrong JSON type."""
    for field, expected in FIELD_TYPES.get(kind, {}).items():
        value = data.get(field)
        if value is not None and not _fits(value, expected):
            raise InvalidRequestError(
                f"Invalid {field}: must be {expected}, not a JSON "
                f"{_JSON_NAMES.get(type(value), type(value).__name__)}.",
                param=field,
            )

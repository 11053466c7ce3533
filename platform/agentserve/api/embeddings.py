"""/v1/embeddings (OpenAI's embeddings API): the request validated at the edge, and the
answer in OpenAI's shape.

A request is {"model", "input", "encoding_format"?, "dimensions"?, "user"?}: `input` a
string, a list of strings, a token list (one input) or a list of token lists, at most
MAX_EMBED_INPUTS inputs, none empty. `encoding_format` float (default) or base64 (each
vector as little-endian float32 bytes, base64-encoded, as OpenAI sends it). `dimensions`
is refused: the served models give their full size only. Other fields are refused too,
naming the field (a typo never passes silently).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentserve.api.errors import InvalidRequestError

__all__ = ["MAX_EMBED_INPUTS", "EmbeddingsRequest", "embed_only", "embeddings_response"]
__all__ += ["generate_only", "parse_embeddings"]

MAX_EMBED_INPUTS = 256  # inputs in one request (the body limit bounds their size)
MAX_TOKEN_ID = 2**31 - 1
_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})

Input = str | tuple[int, ...]


@dataclass(frozen=True)
class EmbeddingsRequest:
    """A validated embeddings request; `inputs` in the client's order."""

    model: str
    inputs: tuple[Input, ...]
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None


def embed_only(model: str, embedders: Collection[str]) -> None:
    """400 model_not_embedding when `model` (served) is not one of the `embedders` (the
    models of task embed): an embeddings request to a model that generates."""
    if model not in embedders:
        raise InvalidRequestError(
            f"The model {model!r} is not an embedding model (task: generate); serve one "
            "with `task: embed` for /v1/embeddings.",
            param="model",
            code="model_not_embedding",
        )


def generate_only(model: str, embedders: Collection[str]) -> None:
    """400 model_not_generative when `model` is one of the `embedders`: a chat,
    completion or responses request to an embedding model."""
    if model in embedders:
        raise InvalidRequestError(
            f"The model {model!r} is an embedding model (task: embed): it serves "
            "/v1/embeddings only, not chat or text completions.",
            param="model",
            code="model_not_generative",
        )


def parse_embeddings(data: Any) -> EmbeddingsRequest:
    """The decoded JSON body -> EmbeddingsRequest, or InvalidRequestError (400) naming the
    field."""
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"Unrecognized request argument: {unknown[0]!r}", param=unknown[0]
        )
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' must be a non-empty string.", param="model")
    if data.get("dimensions") is not None:
        raise InvalidRequestError(
            f"'dimensions' is not supported: model {model!r} returns its full embedding size.",
            param="dimensions",
            code="unsupported_parameter",
        )
    encoding = data.get("encoding_format", "float") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequestError(
            "'encoding_format' must be 'float' or 'base64'.", param="encoding_format"
        )
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequestError("'user' must be a string.", param="user")
    if "input" not in data:
        raise InvalidRequestError("'input' is required.", param="input")
    return EmbeddingsRequest(model, _inputs(data["input"]), encoding, user)


def _inputs(value: Any) -> tuple[Input, ...]:
    """One input per text or token list (see the module docstring)."""
    if isinstance(value, str):
        return (_text(value, "input"),)
    if not isinstance(value, list) or not value:
        raise InvalidRequestError(
            "'input' must be a non-empty string, a list of strings, a token list or a "
            "list of token lists.",
            param="input",
        )
    if all(_token(v) for v in value):
        return (tuple(value),)  # one token list
    if len(value) > MAX_EMBED_INPUTS:
        raise InvalidRequestError(
            f"'input' has {len(value)} items; at most {MAX_EMBED_INPUTS} per request.",
            param="input",
            code="too_many_inputs",
        )
    return tuple(_one(v, f"input[{i}]") for i, v in enumerate(value))


def _one(value: Any, where: str) -> Input:
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, list) and value and all(_token(v) for v in value):
        return tuple(value)
    raise InvalidRequestError(
        f"'{where}' must be a non-empty string or a non-empty list of token ids "
        f"(integers 0 to {MAX_TOKEN_ID}).",
        param=where,
    )


def _text(value: str, where: str) -> str:
    if not value:
        raise InvalidRequestError(f"'{where}' must not be an empty string.", param=where)
    return value


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def embeddings_response(
    request: EmbeddingsRequest, vectors: Sequence[Sequence[float]], prompt_tokens: int
) -> dict[str, Any]:
    """OpenAI's embeddings list: one entry per input, in order, and the usage."""
    encode = _base64 if request.encoding_format == "base64" else list
    data = [
        {"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": request.model, "usage": usage}


def _base64(vector: Sequence[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")

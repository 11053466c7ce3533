"""The fake engine's embeddings: deterministic unit vectors, words are tokens.

An input's vector depends only on its text (or token ids) and the size: component i is a
CRC-32 hash of (i, input) mapped to [-1, 1], then the vector is L2-normalized, so equal
inputs give equal vectors and different inputs (almost surely) different ones. Its token
count is its whitespace words (token ids: their number); an input of max_model_len tokens
or more is refused with vLLM's 400 (context_length_exceeded).
"""

from __future__ import annotations

import math
import zlib

from agentserve.engine.protocol import Embeddings, EmbedRequest, EngineRequestError

__all__ = ["DEFAULT_EMBED_SIZE", "fake_embeddings", "fake_vector"]

DEFAULT_EMBED_SIZE = 8
_HASH_RANGE = 2**32 - 1


def fake_vector(item: str | tuple[int, ...], size: int) -> tuple[float, ...]:
    """The unit vector of one input (see the module docstring)."""
    key = item if isinstance(item, str) else " ".join(map(str, item))
    raw = [zlib.crc32(f"{i}:{key}".encode()) / _HASH_RANGE * 2 - 1 for i in range(size)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return tuple(x / norm for x in raw)


def fake_embeddings(request: EmbedRequest, max_model_len: int, size: int) -> Embeddings:
    """One vector per input, in order; 400 when an input does not fit the context."""
    tokens = 0
    for index, item in enumerate(request.inputs):
        count = len(item.split()) if isinstance(item, str) else len(item)
        if count >= max_model_len:
            raise EngineRequestError(
                f"This model's maximum context length is {max_model_len} tokens; input "
                f"{index} has {count} tokens",
                code="context_length_exceeded",
                param="input",
            )
        tokens += count
    return Embeddings(tuple(fake_vector(i, size) for i in request.inputs), tokens)

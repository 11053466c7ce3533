"""Embeddings from vLLM's pooling runner (ModelSpec.task "embed": runner pooling, convert
embed, engine/vllm_args.py): each input is one AsyncLLM.encode request with
PoolingParams(task="embed"), all submitted at once so the engine batches them.

vLLM is imported on first use, on the replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentserve.engine.protocol import Embeddings, EmbedRequest

__all__ = ["encode_all"]


async def encode_all(client: Any, request: EmbedRequest) -> Embeddings:
    """One vector per input of `request` from the started AsyncLLM `client`; cancelling
    aborts the inputs still running (AsyncLLM aborts a cancelled encode). vLLM's client
    errors (an input past the context) propagate as vLLM raises them."""
    from vllm.pooling_params import PoolingParams

    outputs = await asyncio.gather(  # params each: vLLM's verify() fills them in per request
        *(
            _encode(
                client, item, PoolingParams(task="embed"), f"embd-{request.request_id}-{i}",
                request.headers,
            )
            for i, item in enumerate(request.inputs)
        )
    )  # fmt: skip
    vectors = tuple(tuple(_vector(out)) for out in outputs)
    return Embeddings(vectors, sum(len(out.prompt_token_ids) for out in outputs))


async def _encode(
    client: Any,
    item: str | tuple[int, ...],
    params: Any,
    request_id: str,
    headers: Mapping[str, str],
) -> Any:
    prompt = item if isinstance(item, str) else {"prompt_token_ids": list(item)}
    final = None
    async for out in client.encode(prompt, params, request_id, trace_headers=dict(headers)):
        final = out
    if final is None:
        raise RuntimeError(f"vLLM returned no embedding for request {request_id}")
    return final


def _vector(output: Any) -> list[float]:
    """The pooled vector of one PoolingRequestOutput ([hidden] tensor), as floats."""
    data = output.outputs.data
    if data.ndim != 1:
        raise RuntimeError(f"vLLM pooled a {tuple(data.shape)} tensor, not a vector")
    return data.float().tolist()

"""Drafting: keep the drafter's context cache and propose a block of tokens in one pass."""

from __future__ import annotations

import torch

from dflash.model import DFlashDrafter
from dflash.sampling import SamplingParams, sample_from_probs, sampling_probs
from dflash.target import KVCache, TargetModel

__all__ = ["add_context", "new_context_cache", "propose"]


def new_context_cache(drafter: DFlashDrafter, batch_size: int, capacity: int) -> KVCache:
    """Empty per-layer context keys/values for the drafter (one slot per verified token)."""
    cfg = drafter.config
    param = drafter.fc.weight
    shape = (batch_size, cfg.num_key_value_heads, capacity, cfg.head_dim)

    def zeros() -> torch.Tensor:
        return torch.zeros(shape, dtype=param.dtype, device=param.device)

    return KVCache(
        keys=[zeros() for _ in drafter.layers],
        values=[zeros() for _ in drafter.layers],
        lengths=torch.zeros(batch_size, dtype=torch.long, device=param.device),
    )


@torch.inference_mode()
def add_context(
    drafter: DFlashDrafter, cache: KVCache, features: torch.Tensor, counts: torch.Tensor
) -> None:
    """Append target features [B, N, F] of newly verified tokens; row b keeps counts[b] of N."""
    steps = features.shape[1]
    positions = cache.lengths[:, None] + torch.arange(steps, device=features.device)  # [B, N]
    kv = drafter.context_kv(drafter.project_context(features), positions)
    for layer, (k, v) in enumerate(kv):
        cache.write(layer, positions, k, v)
    cache.advance(counts)


@torch.inference_mode()
def propose(
    drafter: DFlashDrafter,
    target: TargetModel,
    cache: KVCache,
    last_tokens: torch.Tensor,
    num_draft_tokens: int,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft num_draft_tokens (K) tokens after last_tokens [B] in one drafter pass.

    The block is [last, mask x K] at positions [len, len + K]; it sees every context slot
    below len and itself (bidirectionally). Returns draft tokens [B, K] and, when
    sampling, the distribution they were drawn from [B, K, V] (None when greedy).
    """
    batch = last_tokens.shape[0]
    cfg = drafter.config
    if not 1 <= num_draft_tokens <= cfg.num_draft_tokens:
        raise ValueError(f"num_draft_tokens must be in [1, {cfg.num_draft_tokens}]")
    width = num_draft_tokens + 1
    block = torch.full(
        (batch, width), cfg.mask_token_id, dtype=torch.long, device=last_tokens.device
    )
    block[:, 0] = last_tokens
    positions = cache.lengths[:, None] + torch.arange(width, device=block.device)  # [B, K+1]

    span = int(cache.lengths.max())
    context = [
        (k[:, :, :span], v[:, :, :span]) for k, v in zip(cache.keys, cache.values, strict=True)
    ]
    ctx_visible = (
        torch.arange(span, device=block.device)[None, :] < cache.lengths[:, None]
    )  # [B, C]
    block_visible = torch.ones(batch, width, dtype=torch.bool, device=block.device)
    mask = torch.cat([ctx_visible, block_visible], dim=1)[:, None, None, :].expand(-1, 1, width, -1)

    embeds = drafter.block_embeds(block, target.embed_tokens)
    hidden = drafter(embeds, positions, context, mask)[:, 1:]  # [B, K, H]
    logits = drafter.logits(hidden, target.lm_head)  # [B, K, V]
    if params.greedy:
        return logits.argmax(dim=-1), None
    probs = sampling_probs(logits, params)
    return sample_from_probs(probs, generator), probs

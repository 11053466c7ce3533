"""Training blocks: anchors in the response, block inputs/labels, and the attention mask.

A block anchored at position a is [x_a, mask x (S-1)] at positions a..a+S-1 with labels
x_{a+1}..x_{a+S-1}; it sees the target features of positions < a (exactly what inference
has) and, bidirectionally, its own block, never another block.
"""

from __future__ import annotations

import torch

__all__ = ["IGNORE", "all_anchors", "block_inputs", "sample_anchors", "training_mask"]

IGNORE = -100


def sample_anchors(
    start: int, length: int, num_blocks: int, generator: torch.Generator
) -> torch.Tensor:
    """num_blocks anchors in [start - 1, length - 2] (distinct when there is room). [A]"""
    low, high = max(start - 1, 0), length - 2
    count = high - low + 1
    if count <= 0:
        raise ValueError(f"sequence of length {length} has no response to anchor (start {start})")
    if count >= num_blocks:
        picks = torch.randperm(count, generator=generator)[:num_blocks]
    else:
        picks = torch.randint(0, count, (num_blocks,), generator=generator)
    return (picks + low).sort().values


def all_anchors(start: int, length: int) -> torch.Tensor:
    """Every anchor whose block predicts a response token: [start - 1, length - 2]. [A]

    What inference does: a block is drafted after every committed token of the response,
    so training on each one (not a sample) uses all the data each sequence's features hold.
    """
    low, high = max(start - 1, 0), length - 2
    if high < low:
        raise ValueError(f"sequence of length {length} has no response to anchor (start {start})")
    return torch.arange(low, high + 1)


def block_inputs(
    tokens: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [T], anchors [A] -> block tokens, positions, labels, each [A, S]."""
    offsets = torch.arange(block_size)
    positions = anchors[:, None] + offsets  # [A, S]
    inputs = torch.full_like(positions, mask_token_id)
    inputs[:, 0] = tokens[anchors]
    in_range = positions < len(tokens)
    labels = torch.where(in_range, tokens[positions.clamp(max=len(tokens) - 1)], IGNORE)
    labels[:, 0] = IGNORE  # the anchor token is given, not predicted
    return inputs, positions, labels


def training_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """Visibility [A*S, context_len + A*S]: context slots < own anchor, plus own block."""
    num = len(anchors)
    block_of_query = torch.arange(num).repeat_interleave(block_size)  # [A*S]
    ctx = torch.arange(context_len)[None, :] < anchors[block_of_query][:, None]  # [A*S, C]
    own = block_of_query[:, None] == block_of_query[None, :]  # [A*S, A*S]
    return torch.cat([ctx, own], dim=1)

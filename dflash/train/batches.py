"""Training batches: which sequences go together, and their padded block tensors.

Two ways to anchor blocks: `sampled` (a fixed number of random anchors per sequence, random
sequences per step) and `all` (every response position is an anchor, as at inference;
sequences of similar length share a batch so little of it is padding, and each epoch visits
every sequence once, in a seeded order that depends only on the epoch, so a resumed run
picks up exactly where it stopped).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash.train.masks import IGNORE, all_anchors, block_inputs, sample_anchors, training_mask

__all__ = ["Batch", "length_groups", "make_batch", "rows_for_step"]


def length_groups(
    anchor_counts: list[int], context_lens: list[int], budget: int
) -> list[list[int]]:
    """Sequence indices in batches of similar length, each padded size within `budget`.

    Sorted by (anchors, context length) and cut so that rows x most anchors x (1 + most
    context / 256) stays within budget (one row at least): the cost of a step grows with the
    block queries and, more slowly, with the context every query attends to.
    """
    order = sorted(range(len(anchor_counts)), key=lambda i: (anchor_counts[i], context_lens[i]))
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        rows = [*current, i]
        cost = len(rows) * max(anchor_counts[r] for r in rows)
        cost *= 1 + max(context_lens[r] for r in rows) / 256
        if current and cost > budget:
            groups.append(current)
            rows = [i]
        current = rows
    if current:
        groups.append(current)
    return groups


def rows_for_step(groups: list[list[int]], step: int, seed: int) -> list[int]:
    """The batch of `step`: epoch step // len(groups), in that epoch's seeded order."""
    epoch, index = divmod(step, len(groups))
    order = list(range(len(groups)))
    random.Random(seed * 100_003 + epoch).shuffle(order)
    return groups[order[index]]


@dataclass
class Batch:
    features: torch.Tensor  # [B, C, F] target features (padded)
    context_positions: torch.Tensor  # [B, C]
    embeds: torch.Tensor  # [B, A*S, H] block input embeddings
    positions: torch.Tensor  # [B, A*S]
    mask: torch.Tensor  # [B, 1, A*S, C + A*S] bool
    labels: torch.Tensor  # [B, A, S] target token ids, IGNORE where none
    soft_ids: torch.Tensor | None  # [B, A, S, K] target top-k ids per block position
    soft_logp: torch.Tensor | None  # [B, A, S, K] their log-probabilities


def _pad_rows(t: torch.Tensor, size: int) -> torch.Tensor:
    """Pad dim 0 to `size` by repeating the last row."""
    if len(t) == size:
        return t
    return torch.cat([t, t[-1:].expand(size - len(t), *t.shape[1:])])


def make_batch(
    store,
    rows: list[int],
    block_size: int,
    mask_token_id: int,
    embed: torch.Tensor,
    *,
    blocks_per_seq: int | None,
    generator: torch.Generator,
    soft: bool = False,
) -> Batch:
    """Padded tensors for one step. blocks_per_seq None: every response position anchors a
    block; rows with fewer anchors repeat their last block with its labels ignored."""
    anchors = [
        all_anchors(store.starts[r], len(store.tokens[r]))
        if blocks_per_seq is None
        else sample_anchors(store.starts[r], len(store.tokens[r]), blocks_per_seq, generator)
        for r in rows
    ]
    num = max(len(a) for a in anchors)
    ctx_len = max(len(store.tokens[r]) for r in rows)
    keys = ("f", "cp", "e", "p", "m", "l", "si", "sl")
    out: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for r, a in zip(rows, anchors, strict=True):
        tokens, length = store.tokens[r], len(store.tokens[r])
        inputs, positions, labels = block_inputs(tokens, a, block_size, mask_token_id)
        real = len(a)
        a, inputs, positions = (_pad_rows(t, num) for t in (a, inputs, positions))
        labels = _pad_rows(labels, num).clone()
        labels[real:] = IGNORE
        out["f"].append(F.pad(store.features[r], (0, 0, 0, ctx_len - length)))
        out["cp"].append(torch.arange(ctx_len))
        out["e"].append(embed[inputs.reshape(-1)])
        out["p"].append(positions.reshape(-1))
        out["m"].append(training_mask(a, ctx_len, block_size))
        out["l"].append(labels)
        if soft:
            # block position j predicts token a + j from the target's distribution at a + j - 1
            source = (positions - 1).clamp(0, length - 1)
            out["si"].append(store.topk_ids[r].long()[source])
            out["sl"].append(store.topk_logp[r].float()[source])
    return Batch(
        features=torch.stack(out["f"]),
        context_positions=torch.stack(out["cp"]),
        embeds=torch.stack(out["e"]),
        positions=torch.stack(out["p"]),
        mask=torch.stack(out["m"])[:, None],
        labels=torch.stack(out["l"]),
        soft_ids=torch.stack(out["si"]) if soft else None,
        soft_logp=torch.stack(out["sl"]) if soft else None,
    )

"""DFlash objective: cross-entropy on the masked block positions, decaying with position,
optionally mixed with distillation on the target's top-k distribution."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dflash.train.masks import IGNORE

__all__ = ["OUT_OF_VOCAB", "block_loss", "position_weights", "soft_cross_entropy"]


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Weight of block position k: 0 for the anchor, exp(-(k - 1) / gamma) after it. [S]

    Early positions matter most: a draft is only as long as its accepted prefix.
    """
    w = torch.tensor([0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)])
    return w


OUT_OF_VOCAB = -1
"""Label of a token the drafter's reduced vocabulary lacks: no loss, counted as a miss."""


def soft_cross_entropy(
    logits: torch.Tensor, soft_ids: torch.Tensor, soft_logp: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy against the target's top-k distribution, renormalised over the ids the
    head has (OUT_OF_VOCAB ids dropped). logits [M, V], soft_ids / soft_logp [M, K] -> [M]
    (0 where the head has none of the k ids)."""
    present = soft_ids != OUT_OF_VOCAB
    q = soft_logp.float().masked_fill(~present, float("-inf")).softmax(-1).nan_to_num(0.0)
    logp = logits.log_softmax(-1).gather(-1, soft_ids.clamp_min(0))
    return -(q * logp.masked_fill(~present, 0.0)).sum(-1)


def block_loss(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    soft: tuple[torch.Tensor, torch.Tensor] | None = None,
    distill: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [N, S, H] (final-normed), lm_head weight [V, H] (the target's frozen head, or
    the drafter's own reduced one), labels [N, S] as row ids of that head.

    soft = (ids [N, S, K] as rows of that head, log-probabilities [N, S, K]): the target's
    top-k next-token distribution per block position; the loss is then (1 - distill) x the
    hard cross-entropy + distill x the cross-entropy against that distribution.

    Returns (weighted mean loss, correct [S] counts, valid [S] counts) for per-position
    accuracy; the anchor position and out-of-sequence labels are ignored, OUT_OF_VOCAB
    labels (reduced head) carry no hard loss and count as misses.
    """
    n, s, _ = hidden.shape
    logits = F.linear(hidden[:, 1:], lm_head).float()  # [N, S-1, V]
    target = labels[:, 1:]
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        target.masked_fill(target == OUT_OF_VOCAB, IGNORE).reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    ).view(n, s - 1)
    valid = (target != IGNORE).float()  # [N, S-1]
    w = weights[1:].to(ce.device)[None, :] * valid
    hard_w = w * (target != OUT_OF_VOCAB)
    if soft is not None and distill > 0:
        ids, logp = (t[:, 1:].reshape(n * (s - 1), -1) for t in soft)
        soft_ce = soft_cross_entropy(logits.reshape(n * (s - 1), -1), ids, logp).view(n, s - 1)
        loss = ((1 - distill) * ce * hard_w + distill * soft_ce * w).sum()
        loss = loss / ((1 - distill) * hard_w.sum() + distill * w.sum()).clamp_min(1e-9)
    else:
        loss = (ce * hard_w).sum() / hard_w.sum().clamp_min(1e-9)
    with torch.no_grad():
        correct = ((logits.argmax(-1) == labels[:, 1:]).float() * valid).sum(0)
    zero = torch.zeros(1, device=hidden.device)
    return loss, torch.cat([zero, correct]), torch.cat([zero, valid.sum(0)])

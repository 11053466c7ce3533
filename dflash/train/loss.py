"""DFlash objective: cross-entropy on the masked block positions, decaying with position."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dflash.train.masks import IGNORE

__all__ = ["OUT_OF_VOCAB", "block_loss", "position_weights"]


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Weight of block position k: 0 for the anchor, exp(-(k - 1) / gamma) after it. [S]

    Early positions matter most: a draft is only as long as its accepted prefix.
    """
    w = torch.tensor([0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)])
    return w


OUT_OF_VOCAB = -1
"""Label of a token the drafter's reduced vocabulary lacks: no loss, counted as a miss."""


def block_loss(
    hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [N, S, H] (final-normed), lm_head weight [V, H] (the target's frozen head, or
    the drafter's own reduced one), labels [N, S] as row ids of that head.

    Returns (weighted mean loss, correct [S] counts, valid [S] counts) for per-position
    accuracy; the anchor position and out-of-sequence labels are ignored, OUT_OF_VOCAB
    labels (reduced head) carry no loss and count as misses.
    """
    n, s, _ = hidden.shape
    logits = F.linear(hidden[:, 1:], lm_head).float()  # [N, S-1, V]
    target = labels[:, 1:]
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        target.masked_fill(target == OUT_OF_VOCAB, IGNORE).reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    valid = (target != IGNORE).float()  # [N, S-1]
    w = weights[1:].to(ce.device)[None, :] * valid * (target != OUT_OF_VOCAB)
    loss = (ce.view(n, s - 1) * w).sum() / w.sum().clamp_min(1e-9)
    with torch.no_grad():
        correct = ((logits.argmax(-1) == labels[:, 1:]).float() * valid).sum(0)
    zero = torch.zeros(1, device=hidden.device)
    return loss, torch.cat([zero, correct]), torch.cat([zero, valid.sum(0)])

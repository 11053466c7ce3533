"""DFlash objective: cross-entropy on the masked block positions, decaying with position."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dflash.train.masks import IGNORE

__all__ = ["block_loss", "position_weights"]


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Weight of block position k: 0 for the anchor, exp(-(k - 1) / gamma) after it. [S]

    Early positions matter most: a draft is only as long as its accepted prefix.
    """
    w = torch.tensor([0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)])
    return w


def block_loss(
    hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [N, S, H] (final-normed), frozen lm_head weight [V, H], labels [N, S].

    Returns (weighted mean loss, correct [S] counts, valid [S] counts) for per-position
    accuracy; the anchor position and out-of-sequence labels are ignored.
    """
    n, s, _ = hidden.shape
    logits = F.linear(hidden[:, 1:], lm_head).float()  # [N, S-1, V]
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    valid = (labels[:, 1:] != IGNORE).float()  # [N, S-1]
    w = weights[1:].to(ce.device)[None, :] * valid
    loss = (ce.view(n, s - 1) * w).sum() / w.sum().clamp_min(1e-9)
    with torch.no_grad():
        correct = ((logits.argmax(-1) == labels[:, 1:]).float() * valid).sum(0)
    zero = torch.zeros(1, device=hidden.device)
    return loss, torch.cat([zero, correct]), torch.cat([zero, valid.sum(0)])

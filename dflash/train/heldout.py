"""Held-out acceptance during training: what greedy verification would accept, per checkpoint.

The held-out set is the target's own greedy responses to held-out prompts (never trained
on), with their features. On a greedy response, the draft of a block anchored at position a
is accepted up to its first token that differs from the response, and the drafter sees
exactly what inference shows it (the target's features before a, the anchor token, masks).
So teacher forcing over every anchor gives the greedy acceptance at each position without
running the target again: position-1 acceptance and tau (1 + accepted drafts per step).
"""

from __future__ import annotations

import torch

from dflash.train.masks import all_anchors, block_inputs, training_mask

__all__ = ["accepted_per_anchor", "greedy_records", "teacher_forced_acceptance"]


def greedy_records(
    target, prompts: list[list[int]], stop_id: int, max_new_tokens: int = 128
) -> list[dict]:
    """The target's greedy responses to `prompts`, as feature-extraction records."""
    from dflash.generate import generate

    records = []
    for i in range(0, len(prompts), 8):
        chunk = prompts[i : i + 8]
        out = generate(target, chunk, max_new_tokens, stop_token_ids=[stop_id]).tokens
        records += [
            {"prompt_ids": p, "response_ids": r} for p, r in zip(chunk, out, strict=True) if r
        ]
    return records


def _predicted_ids(drafter, hidden: torch.Tensor, target_head: torch.Tensor) -> torch.Tensor:
    """Greedy draft token ids (target vocabulary) from final-normed hidden [..., H]."""
    if drafter.own_head:
        rows = torch.nn.functional.linear(hidden, drafter.lm_head.weight).argmax(-1)
        return drafter.draft_token_ids()[rows]
    return torch.nn.functional.linear(hidden, target_head).argmax(-1)


@torch.no_grad()
def accepted_per_anchor(
    drafter, tokens, start: int, features, embed: torch.Tensor, target_head, num_draft: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors [A], greedy drafts accepted at each [A]) over one sequence's response, for
    the anchors with num_draft tokens of response after them."""
    cfg, length = drafter.config, len(tokens)
    anchors = all_anchors(start, length)
    anchors = anchors[anchors <= length - 1 - num_draft]
    if len(anchors) == 0:
        return anchors, anchors
    block = num_draft + 1  # what inference runs: the anchor and num_draft mask slots
    inputs, positions, labels = block_inputs(tokens, anchors, block, cfg.mask_token_id)
    ctx = drafter.context_kv(drafter.project_context(features[None]), torch.arange(length)[None])
    mask = training_mask(anchors, length, block)[None, None]
    hidden = drafter(embed[inputs.reshape(1, -1)], positions.reshape(1, -1), ctx, mask)
    hidden = hidden.view(len(anchors), block, -1)[:, 1:]
    drafts = _predicted_ids(drafter, hidden.float(), target_head)
    hit = (drafts == labels[:, 1:]).long()
    return anchors, hit.cumprod(dim=1).sum(dim=1)  # leading matches


def teacher_forced_acceptance(
    drafter, store, embed: torch.Tensor, target_head, num_draft: int | None = None
) -> dict:
    """Greedy acceptance over every anchor of every held-out sequence with `num_draft` (default
    block size - 1) labels left: {"position_acceptance": [P(first j drafts accepted)],
    "p1", "tau", "anchors"}."""
    k = num_draft or drafter.config.block_size - 1
    was_training = drafter.training
    drafter.eval()
    counts = torch.zeros(k + 1, dtype=torch.long)  # histogram of accepted lengths
    for r in range(len(store)):
        _, accepted = accepted_per_anchor(
            drafter, store.tokens[r], store.starts[r], store.features[r], embed, target_head, k
        )
        counts += torch.bincount(accepted, minlength=k + 1)
    drafter.train(was_training)
    total = int(counts.sum())
    if total == 0:
        raise ValueError("held-out set has no anchor with enough response left")
    at_least = [int(counts[j:].sum()) / total for j in range(1, k + 1)]
    return {
        "position_acceptance": [round(a, 4) for a in at_least],
        "p1": round(at_least[0], 4),
        "tau": round(1 + sum(at_least), 4),
        "anchors": total,
    }

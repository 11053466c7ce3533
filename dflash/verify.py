"""Acceptance rules for a drafted block: greedy prefix match and lossless rejection sampling.

Shapes: B sequences, K drafted tokens each, V vocabulary. The target scored the block
[last, d_1..d_K], so it has K + 1 rows of logits: row i predicts the token after d_i
(row 0 predicts d_1's slot). Both rules return, per sequence, how many drafted tokens
were accepted (0..K) and the next token (the correction at the first rejection, or the
bonus token after a fully accepted block).
"""

from __future__ import annotations

import torch

from dflash.sampling import SamplingParams, sample_from_probs, sampling_probs

__all__ = ["accept", "greedy_accept", "speculative_accept"]


def greedy_accept(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest prefix where the draft equals the target's argmax, plus the target's token.

    draft_tokens [B, K], target_logits [B, K+1, V] -> (num_accepted [B], next_token [B]).
    """
    target_tokens = target_logits.argmax(dim=-1)  # [B, K+1]
    matches = (draft_tokens == target_tokens[:, :-1]).long()  # [B, K]
    num_accepted = matches.cumprod(dim=1).sum(dim=1)  # [B]
    next_token = target_tokens.gather(1, num_accepted[:, None])[:, 0]
    return num_accepted, next_token


def speculative_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling (Leviathan et al. / Chen et al.): output ~ target_probs exactly.

    draft_tokens [B, K] sampled from draft_probs [B, K, V]; target_probs [B, K+1, V].
    Token i is accepted with probability min(1, p_i(d_i) / q_i(d_i)); at the first
    rejection the replacement is drawn from normalize(max(0, p_i - q_i)); if all K are
    accepted the bonus token is drawn from p_K.
    """
    batch, k = draft_tokens.shape
    p = target_probs[:, :k].gather(-1, draft_tokens[..., None])[..., 0]  # [B, K]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]  # [B, K]
    u = torch.rand(q.shape, generator=generator, device=q.device)
    accepted = (u * q < p).long()  # u < p/q without dividing by a zero q
    num_accepted = accepted.cumprod(dim=1).sum(dim=1)  # [B]

    rows = torch.arange(batch, device=draft_tokens.device)
    p_next = target_probs[rows, num_accepted]  # [B, V]: p at the stop position
    padded_q = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)
    q_next = padded_q[rows, num_accepted]  # zero row when everything was accepted
    residual = (p_next - q_next).clamp_min(0)
    mass = residual.sum(dim=-1, keepdim=True)
    # mass == 0 only when p == q at that row, where rejection cannot happen; fall back to p.
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
    next_token = sample_from_probs(residual, generator)
    return num_accepted, next_token


def accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the rule that fits `params`. draft_probs is None for greedy decoding;
    otherwise it is the (transformed) distribution the draft tokens were sampled from."""
    if params.greedy:
        return greedy_accept(draft_tokens, target_logits)
    if draft_probs is None:
        raise ValueError("sampling needs the draft distribution the tokens were drawn from")
    return speculative_accept(
        draft_tokens, draft_probs, sampling_probs(target_logits, params), generator
    )

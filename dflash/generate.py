"""Reference generation loop: plain decoding or DFlash (draft block -> verify -> accept).

Readable over fast: small functions in call order, one batch of sequences, each with its
own acceptance. `generate(..., drafter=None)` is plain decoding through the same target
code, which is what DFlash must reproduce token for token under greedy decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dflash.draft import add_context, new_context_cache, propose
from dflash.model import DFlashDrafter
from dflash.sampling import SamplingParams, sample_from_probs, sampling_probs
from dflash.target import KVCache, TargetModel
from dflash.verify import accept

__all__ = ["GenerationResult", "GenerationStats", "generate"]


@dataclass
class GenerationStats:
    """Counts over all (sequence, step) pairs of one generate() call."""

    num_steps: int = 0  # target forward passes after prefill
    num_tokens: int = 0  # tokens emitted, all sequences
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens emitted per seq-step
    position_accepted: list[int] = field(default_factory=list)  # [K]: drafts accepted at pos i
    position_drafted: int = 0  # seq-steps that drafted (denominator for position_accepted)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens emitted per sequence per step (accepted drafts + 1)."""
        return sum(self.acceptance_lengths) / max(len(self.acceptance_lengths), 1)

    @property
    def per_position_acceptance(self) -> list[float]:
        return [n / max(self.position_drafted, 1) for n in self.position_accepted]

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / max(self.prefill_s + self.decode_s, 1e-9)


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # generated tokens per input sequence (prompt excluded)
    stats: GenerationStats


@dataclass
class _Batch:
    """Live sequences: which input each row is, its last token, what it produced."""

    rows: torch.Tensor  # [B] index into the original prompts
    last: torch.Tensor  # [B] newest token (emitted, not yet fed to the target)
    outputs: list[list[int]]  # per original prompt


def _choose(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample_from_probs(sampling_probs(logits, params), generator)


def _prefill(
    target: TargetModel, prompts: list[list[int]], capacity: int, want_features: list[int] | None
) -> tuple[KVCache, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Run the right-padded prompts. Returns cache, last logits [B, V], features, lengths."""
    device = target.embed_tokens.weight.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    tokens = torch.zeros(len(prompts), int(lengths.max()), dtype=torch.long, device=device)
    for i, prompt in enumerate(prompts):
        tokens[i, : len(prompt)] = torch.tensor(prompt, device=device)
    cache = target.new_cache(len(prompts), capacity)
    out = target(tokens, cache, feature_layers=want_features, logits_at=lengths - 1)
    cache.advance(lengths)
    return cache, out.logits[:, 0], out.features, lengths


def _emit(
    batch: _Batch,
    drafts: torch.Tensor | None,
    num_accepted: torch.Tensor,
    next_token: torch.Tensor,
    max_new_tokens: int,
    stop_ids: set[int],
) -> torch.Tensor:
    """Append accepted drafts + next token per row, cut at stop/limit. Returns done mask [B]."""
    done = torch.zeros(len(batch.rows), dtype=torch.bool)
    for b, row in enumerate(batch.rows.tolist()):
        n = int(num_accepted[b])
        new = (drafts[b, :n].tolist() if drafts is not None else []) + [int(next_token[b])]
        out = batch.outputs[row]
        for tok in new:
            out.append(tok)
            if tok in stop_ids or len(out) >= max_new_tokens:
                done[b] = True
                break
    return done


def _record(stats: GenerationStats, num_accepted: torch.Tensor, num_draft: int) -> None:
    stats.num_steps += 1
    stats.acceptance_lengths.extend((num_accepted + 1).tolist())
    if num_draft:
        if not stats.position_accepted:
            stats.position_accepted = [0] * num_draft
        stats.position_drafted += len(num_accepted)
        for i in range(num_draft):
            stats.position_accepted[i] += int((num_accepted > i).sum())


@torch.inference_mode()
def generate(
    target: TargetModel,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams = SamplingParams(),
    drafter: DFlashDrafter | None = None,
    num_draft_tokens: int | None = None,
    stop_token_ids: tuple[int, ...] | list[int] = (),
    seed: int | None = None,
) -> GenerationResult:
    """Generate up to max_new_tokens per prompt (token ids); DFlash when a drafter is given."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    num_draft = 0 if drafter is None else (num_draft_tokens or drafter.config.num_draft_tokens)
    layer_ids = drafter.config.target_layer_ids if drafter is not None else None
    capacity = max(len(p) for p in prompts) + max_new_tokens + num_draft + 2
    stop_ids, stats = set(stop_token_ids), GenerationStats()

    start = time.perf_counter()
    cache, logits, features, lengths = _prefill(target, prompts, capacity, layer_ids)
    first = _choose(logits, params, generator)
    batch = _Batch(rows=torch.arange(len(prompts)), last=first, outputs=[[] for _ in prompts])
    done = _emit(batch, None, torch.zeros_like(first), first, max_new_tokens, stop_ids)
    ctx_cache = None
    if drafter is not None:
        ctx_cache = new_context_cache(drafter, len(prompts), capacity)
        add_context(drafter, ctx_cache, features, lengths)
    stats.prefill_s = time.perf_counter() - start

    start = time.perf_counter()
    while True:
        batch, done = _drop_finished(batch, done, cache, ctx_cache)
        if len(batch.rows) == 0:
            break
        drafts, draft_probs = None, None
        block = batch.last[:, None]
        if drafter is not None:
            drafts, draft_probs = propose(
                drafter, target, ctx_cache, batch.last, num_draft, params, generator
            )
            block = torch.cat([block, drafts], dim=1)  # [B, K+1]
        out = target(block, cache, feature_layers=layer_ids)
        if drafter is not None:
            num_accepted, next_token = accept(drafts, draft_probs, out.logits, params, generator)
        else:
            num_accepted = torch.zeros(len(batch.rows), dtype=torch.long)
            next_token = _choose(out.logits[:, 0], params, generator)
        cache.advance(num_accepted + 1)  # commit last + accepted drafts; the rest is trimmed
        if ctx_cache is not None:
            add_context(drafter, ctx_cache, out.features, num_accepted + 1)
        _record(stats, num_accepted, num_draft)
        done = _emit(batch, drafts, num_accepted, next_token, max_new_tokens, stop_ids)
        batch.last = next_token
    stats.decode_s = time.perf_counter() - start
    stats.num_tokens = sum(len(o) for o in batch.outputs)
    return GenerationResult(tokens=batch.outputs, stats=stats)


def _drop_finished(
    batch: _Batch, done: torch.Tensor, cache: KVCache, ctx_cache: KVCache | None
) -> tuple[_Batch, torch.Tensor]:
    if not bool(done.any()):
        return batch, done
    keep = (~done).nonzero()[:, 0]
    cache.keep(keep)
    if ctx_cache is not None:
        ctx_cache.keep(keep)
    kept = _Batch(rows=batch.rows[keep], last=batch.last[keep], outputs=batch.outputs)
    return kept, done[keep]

"""Hybrid drafting without DFlash's block forward on steps n-gram drafts alone
(docs/architecture.md; measured in docs/benchmarks.md).

A hybrid engine (speculation/hybrid_drafter.py) runs vLLM's DFlash proposer every step, then
per request puts the n-gram draft in place of DFlash's where prompt lookup matches. When
every request matches, or the batch is bigger than `drafter.dflash_max_batch`, the proposer
here only stores the context K/V (`precompute_and_store_context_kv`: the drafter must see
every accepted token) and skips its block forward ("context only").

Whether every request matches is decided inside the step, before the proposer runs:
`lookup_all` writes the step's valid sampled tokens where the runner's bookkeeping writes
the same values moments later, and runs the n-gram lookup on lengths of its own. A request
without tokens (a prefill chunk, a discarded row) or without a match lets the block forward
run. The drafts are still chosen after the step (`HybridDrafts.combine`); on a context-only
step a request without a match drafts nothing. Lossless either way: the target verifies
whatever is drafted.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

__all__ = ["context_only_propose", "lookup_all", "patch_proposer", "wrap_propose_step"]

log = logging.getLogger(__name__)

FLAG = "_agentserve_context_only"


def lookup_all(
    ngram: Any, valid: list[list[int]], lengths: Any, token_ids: Any, max_len: int
) -> bool:
    """True when prompt lookup finds a draft for every row, with row i's `valid` tokens
    appended at `lengths[i]` of `token_ids` (written there: the values the runner's
    bookkeeping writes next). Writes nothing and says False when a row has no tokens or
    would pass `max_len`; `lengths` is left as given."""
    if not valid or any(not ids for ids in valid):
        return False
    ends = [int(lengths[row]) + len(ids) for row, ids in enumerate(valid)]
    if any(end > max_len for end in ends):
        return False
    grown = lengths.copy()
    for row, ids in enumerate(valid):
        token_ids[row, int(lengths[row]) : ends[row]] = ids
        grown[row] = ends[row]
    found = ngram.propose(ngram.k, valid, grown, token_ids)
    return all(len(f) > 0 for f in found)


def _valid_tokens(runner: Any, sampled: Any) -> list[list[int]]:
    """This step's accepted tokens per row, as the runner's bookkeeping will parse them."""
    import numpy as np
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    batch = runner.input_batch
    discard = np.nonzero(runner.discard_request_mask.np[: batch.num_reqs])[0]
    valid, _ = RejectionSampler.parse_output(sampled, batch.vocab_size, discard)
    return valid


def wrap_propose_step(original: Any, hybrid_of: Any) -> Any:
    """The runner's `propose_draft_token_ids`: for a hybrid engine, decide before the
    proposer runs whether prompt lookup drafts every request (or the batch is bigger than
    `dflash_max_batch`, where n-gram drafts alone); if so the proposer stores
    context K/V only (FLAG on the drafter) and `HybridDrafts.context_only` tells
    `combine` that DFlash's drafts are placeholders."""

    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled: Any, *a: Any, **kw: Any):
        hybrid = hybrid_of(self)
        if hybrid is None:
            return original(self, scheduler_output, sampled, *a, **kw)
        batch = self.input_batch
        context_only = hybrid.dflash_max_batch is not None and (
            batch.num_reqs > hybrid.dflash_max_batch  # n-gram drafts alone in a big batch
        )
        if not context_only and hasattr(sampled, "shape"):  # padded: a tensor for DFlash
            try:
                context_only = lookup_all(
                    hybrid.ngram,
                    _valid_tokens(self, sampled),
                    batch.num_tokens_no_spec[: batch.num_reqs],
                    batch.token_ids_cpu,
                    self.max_model_len,
                )
            except Exception:  # a decision, never a reason to fail the step
                log.debug("agentserve hybrid: early lookup failed", exc_info=True)
        hybrid.context_only = context_only
        setattr(self.drafter, FLAG, context_only)
        try:
            return original(self, scheduler_output, sampled, *a, **kw)
        finally:
            setattr(self.drafter, FLAG, False)

    propose_draft_token_ids.__wrapped__ = original  # type: ignore[attr-defined]
    propose_draft_token_ids.agentserve_hybrid = True  # type: ignore[attr-defined]
    return propose_draft_token_ids


def context_only_propose(proposer: Any, args: dict[str, Any]) -> Any:
    """What vLLM's DFlash `propose` does before its block forward: the context K/V of this
    step's target hidden states into the drafter's cache. Returns placeholder drafts
    (zeros, batch x k), which `combine` never hands on."""
    import torch

    cad = args["common_attn_metadata"]
    k = int(args["num_speculative_tokens"])
    proposer.num_speculative_tokens = k
    proposer._last_draft_probs = None
    hidden = proposer.model.combine_hidden_states(args["target_hidden_states"])
    proposer.set_inputs_first_pass(
        target_token_ids=args["target_token_ids"],
        next_token_ids=args["next_token_ids"],
        target_positions=args["target_positions"],
        target_hidden_states=hidden,
        token_indices_to_sample=args.get("token_indices_to_sample"),
        cad=cad,
        num_rejected_tokens_gpu=args.get("num_rejected_tokens_gpu"),
    )
    n = proposer._dflash_num_context
    proposer.model.precompute_and_store_context_kv(
        proposer._dflash_hidden_states,
        proposer._context_positions_buffer[:n],
        proposer._context_slot_mapping_buffer[:n],
    )
    return torch.zeros(cad.batch_size(), k, dtype=torch.int64, device=hidden.device)


def _wrap_proposer(original: Any) -> Any:
    """DFlash's `propose`, context only while the runner's flag is up. A vLLM whose
    proposer lacks what the context-only path reads runs the whole propose from then on
    (one warning): slower hybrid steps, never a failed one."""
    signature = inspect.signature(original)
    broken: list[str] = []

    def propose(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, FLAG, False) or broken:
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            return context_only_propose(self, dict(bound.arguments))
        except (AttributeError, KeyError, TypeError) as err:
            broken.append(repr(err))
            log.warning(
                "agentserve hybrid: context-only steps unavailable with this vLLM (%r); "
                "DFlash runs its block forward on every step",
                err,
            )
            return original(self, *args, **kwargs)

    propose.__wrapped__ = original  # type: ignore[attr-defined]
    propose.agentserve_hybrid = True  # type: ignore[attr-defined]
    return propose


def patch_proposer(runner_class: Any, hybrid_of: Any) -> None:
    """Patch the runner's per-step propose and vLLM's DFlash proposer (once each). The
    proposer's patch acts only while the runner's flag is up: plain DFlash engines and
    every other method run vLLM's code."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    if not getattr(runner_class.propose_draft_token_ids, "agentserve_hybrid", False):
        runner_class.propose_draft_token_ids = wrap_propose_step(
            runner_class.propose_draft_token_ids, hybrid_of
        )
    if not getattr(DFlashProposer.propose, "agentserve_hybrid", False):
        DFlashProposer.propose = _wrap_proposer(DFlashProposer.propose)

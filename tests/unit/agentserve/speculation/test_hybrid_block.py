"""Hybrid steps without DFlash's block forward (speculation/hybrid_block.py): the early prompt
lookup (vLLM's own NgramProposer), the runner and proposer hooks, and `combine` after such
a step. The real engine runs it in tests/integration/test_vllm_dflash.py (float32 greedy
identity, with context-only steps counted)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from agentserve.speculation import hybrid_block as hb
from agentserve.speculation import hybrid_drafter as h


@pytest.fixture(scope="module")
def ngram():
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            prompt_lookup_min=2, prompt_lookup_max=3, num_speculative_tokens=3
        ),
        model_config=SimpleNamespace(max_model_len=64),
        scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=256),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    return NgramProposer(config)  # type: ignore[arg-type]


def _tokens(*rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), 64), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, np.array([len(r) for r in rows], dtype=np.int32)


def test_every_row_matching_once_its_new_tokens_are_in_is_true(ngram):
    ids, lengths = _tokens([5, 6, 7, 8, 1, 2, 5], [9, 3, 4, 9, 3])
    # row 0 gains [6]: "5 6" was seen, followed by 7; row 1 gains [4]: "3 4" -> 9
    assert hb.lookup_all(ngram, [[6], [4]], lengths, ids, 64)
    assert ids[0, 7] == 6 and ids[1, 5] == 4  # written where bookkeeping writes them
    assert lengths.tolist() == [7, 5]  # the runner's lengths are left to bookkeeping


def test_one_row_without_a_match_runs_the_block(ngram):
    ids, lengths = _tokens([5, 6, 7, 8, 1, 2, 5], [9, 3, 4, 9, 3])
    assert not hb.lookup_all(ngram, [[6], [11]], lengths, ids, 64)


def test_a_row_without_tokens_or_past_the_length_writes_nothing(ngram):
    ids, lengths = _tokens([5, 6, 7, 5], [1, 2, 1])
    before = ids.copy()
    assert not hb.lookup_all(ngram, [[6], []], lengths, ids, 64)  # a prefill chunk
    assert not hb.lookup_all(ngram, [[6], [2]], lengths, ids, 4)  # row 0 would pass 4
    assert not hb.lookup_all(ngram, [], lengths, ids, 64)
    assert (ids == before).all()


class Ngram:
    k = 3

    def __init__(self, match: bool):
        self.match = match

    def propose(self, k, valid, lengths, token_ids):
        return [[1] * k if self.match else [] for _ in valid]


def _runner(match: bool, sampled: torch.Tensor, max_batch: int | None = None):
    hybrid = h.HybridDrafts(Ngram(match), dflash_tokens=2, dflash_max_batch=max_batch)
    n = sampled.shape[0]
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(
            num_reqs=n,
            vocab_size=100,
            num_tokens_no_spec=np.full(n, 4, dtype=np.int32),
            token_ids_cpu=np.zeros((n, 32), dtype=np.int32),
        ),
        discard_request_mask=SimpleNamespace(np=np.zeros(n, dtype=bool)),
        max_model_len=32,
        drafter=SimpleNamespace(),
    )
    seen = []

    def original(self, scheduler_output, sampled, *rest):
        seen.append(getattr(self.drafter, hb.FLAG))
        return "drafts"

    step = hb.wrap_propose_step(original, lambda runner: hybrid)
    return runner, hybrid, step, seen


@pytest.mark.parametrize("match", [True, False])
def test_the_runner_flags_the_proposer_only_while_every_row_matches(match):
    sampled = torch.tensor([[3, 4, -1], [5, -1, -1]])  # accepted tokens, rejected -1
    runner, hybrid, step, seen = _runner(match, sampled)
    assert step(runner, None, sampled) == "drafts"
    assert seen == [match] and getattr(runner.drafter, hb.FLAG) is False  # lowered after
    assert hybrid.context_only is match
    if match:
        assert runner.input_batch.token_ids_cpu[0, 4:6].tolist() == [3, 4]


@pytest.mark.parametrize("max_batch, want", [(1, True), (2, False), (None, False)])
def test_a_batch_bigger_than_dflash_max_batch_drafts_with_ngram_alone(max_batch, want):
    sampled = torch.tensor([[3, 4, -1], [5, -1, -1]])  # two rows, prompt lookup misses
    runner, hybrid, step, seen = _runner(False, sampled, max_batch)
    assert step(runner, None, sampled) == "drafts"
    assert seen == [want] and hybrid.context_only is want
    # by the batch rule the early lookup is skipped: no token ids written ahead
    assert runner.input_batch.token_ids_cpu[0, 4:6].tolist() == ([0, 0] if want else [3, 4])


def test_a_list_of_tokens_or_no_hybrid_calls_vllm_unchanged():
    runner, _, step, seen = _runner(True, torch.tensor([[3]]))
    assert step(runner, None, [[3]]) == "drafts" and seen == [False]
    plain = hb.wrap_propose_step(lambda self, so, s: "vllm", lambda runner: None)
    assert plain(runner, None, torch.tensor([[3]])) == "vllm"


class Proposer:
    """DFlashProposer's propose signature, and what the context-only path touches."""

    def __init__(self):
        self.calls = []
        self.model = SimpleNamespace(
            combine_hidden_states=lambda hs: hs * 2,
            precompute_and_store_context_kv=lambda *a: self.calls.append(("store", a)),
        )
        self._context_positions_buffer = torch.arange(10)
        self._context_slot_mapping_buffer = torch.arange(10) + 100

    def set_inputs_first_pass(self, **kw):
        self.calls.append(("inputs", kw))
        self._dflash_num_context = kw["target_hidden_states"].shape[0]
        self._dflash_hidden_states = kw["target_hidden_states"]

    def propose(
        self, num_speculative_tokens, target_token_ids, target_positions,
        target_hidden_states, next_token_ids, token_indices_to_sample,
        common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
        num_rejected_tokens_gpu=None, slot_mappings=None,
    ):  # fmt: skip
        return "block"


def test_the_flagged_proposer_stores_context_kv_and_drafts_placeholders():
    propose = hb._wrap_proposer(Proposer.propose)
    assert inspect.signature(propose.__wrapped__) == inspect.signature(Proposer.propose)
    proposer = Proposer()
    cad = SimpleNamespace(batch_size=lambda: 2)
    kw = dict(
        num_speculative_tokens=3, target_token_ids=torch.arange(5),
        target_positions=torch.arange(5), target_hidden_states=torch.ones(5, 4),
        next_token_ids=torch.tensor([7, 8]), token_indices_to_sample=None,
        common_attn_metadata=cad, sampling_metadata=None,
    )  # fmt: skip
    assert propose(proposer, **kw) == "block" and proposer.calls == []  # flag down: vLLM's
    setattr(proposer, hb.FLAG, True)
    drafts = propose(proposer, **kw)
    assert drafts.shape == (2, 3) and not drafts.any()
    (_, inputs), (_, stored) = proposer.calls
    assert (inputs["target_hidden_states"] == 2).all()  # combined as vLLM does first
    hidden, positions, slots = stored
    assert hidden.shape == (5, 4) and positions.tolist() == [0, 1, 2, 3, 4]
    assert slots.tolist() == [100, 101, 102, 103, 104]
    assert proposer.num_speculative_tokens == 3


def test_after_a_context_only_step_unmatched_rows_draft_nothing_and_steps_are_counted():
    hybrid = h.HybridDrafts(SimpleNamespace(propose=lambda k, s, n, t: [[4, 4], []]), 2)
    hybrid.context_only = True
    out = hybrid.combine(["a", "b"], [[0, 0, 0], [0, 0, 0]], [0, 1], np.array([5, 6]), None)
    assert out == [[4, 4], []]  # placeholders never reach the scheduler
    assert hybrid.context_only is False  # one step only
    hybrid.combine(["a", "b"], [[1, 2, 3], [4, 5, 6]], [0, 1], np.array([8, 7]), None)
    assert hybrid.steps == {"block": 1, "context_only": 1}


def test_a_proposer_without_the_context_path_falls_back_to_vllm_for_good(caplog):
    propose = hb._wrap_proposer(Proposer.propose)
    proposer = Proposer()
    del proposer._context_slot_mapping_buffer  # another vLLM: the attribute is gone
    setattr(proposer, hb.FLAG, True)
    kw = dict(
        num_speculative_tokens=2, target_token_ids=torch.arange(3),
        target_positions=torch.arange(3), target_hidden_states=torch.ones(3, 4),
        next_token_ids=torch.tensor([7]), token_indices_to_sample=None,
        common_attn_metadata=SimpleNamespace(batch_size=lambda: 1), sampling_metadata=None,
    )  # fmt: skip
    assert propose(proposer, **kw) == "block"  # the step still drafts
    assert "context-only steps unavailable" in caplog.text
    proposer.calls.clear()
    assert propose(proposer, **kw) == "block" and proposer.calls == []  # not tried again


def test_the_stats_file_gives_the_step_kinds(tmp_path):
    from agentserve.speculation.hybrid_stats import step_rows

    hybrid = h.HybridDrafts(Ngram(True), 2, stats_path=str(tmp_path / "s.json"))
    assert step_rows(hybrid.stats_path) == ()  # nothing written yet
    hybrid.context_only = True
    hybrid.combine(["a"], [[0, 0]], [0], np.array([5]), None)  # written at once
    assert step_rows(hybrid.stats_path) == (("block", 0), ("context_only", 1))
    assert step_rows(None) == ()

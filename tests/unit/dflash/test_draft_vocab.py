"""Reduced draft vocabulary: the drafter's own small LM head plus vLLM's d2t map."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash.config import DFlashConfig
from dflash.draft import new_context_cache, propose
from dflash.export import load_drafter, save_drafter
from dflash.generate import generate
from dflash.model import DFlashDrafter
from dflash.sampling import SamplingParams
from dflash.train.features import FeatureStore, extract_features
from dflash.train.loss import OUT_OF_VOCAB, block_loss, position_weights
from dflash.train.masks import IGNORE
from dflash.train.trainer import TrainConfig, select_draft_vocab, train

VOCAB = 96  # the tiny target of conftest.py

DRAFT_VOCAB = 32


@pytest.fixture
def small_head(tiny_hf, tiny_target):
    torch.manual_seed(2)
    cfg = DFlashConfig.for_target(
        tiny_hf.config, mask_token_id=VOCAB - 1, block_size=8, draft_vocab_size=DRAFT_VOCAB
    )
    drafter = DFlashDrafter(cfg)
    ids = torch.arange(0, 2 * DRAFT_VOCAB, 2)  # even token ids only
    drafter.set_draft_vocab(ids, tiny_target.lm_head.weight.detach())
    return drafter.eval()


def test_select_draft_vocab_takes_the_most_frequent_and_the_required_ids():
    ids, covered = select_draft_vocab([[5, 5, 5, 7, 7, 9], [5, 7, 1]], 12, 3, always=(11,))
    assert ids.tolist() == [5, 7, 11]
    assert covered == pytest.approx(7 / 9)


def test_d2t_is_vllms_offset_map_and_logits_cover_only_the_draft_vocab(small_head, tiny_target):
    assert small_head.d2t[:3].tolist() == [0, 1, 2]  # draft row i is target id 2 i
    assert small_head.draft_token_ids().tolist() == list(range(0, 2 * DRAFT_VOCAB, 2))
    hidden = torch.randn(2, 3, small_head.config.hidden_size)
    logits = small_head.logits(hidden, tiny_target.lm_head)
    assert logits.shape == (2, 3, VOCAB)
    inside = torch.zeros(VOCAB, dtype=torch.bool)
    inside[: 2 * DRAFT_VOCAB : 2] = True
    assert torch.isfinite(logits[..., inside]).all() and torch.isinf(logits[..., ~inside]).all()
    # the head starts as the target's rows for those ids
    torch.testing.assert_close(logits[..., inside], tiny_target.logits(hidden)[..., inside])
    with pytest.raises(ValueError, match="distinct"):
        small_head.set_draft_vocab(torch.zeros(DRAFT_VOCAB, dtype=torch.long), hidden[0])


def test_proposals_stay_in_the_draft_vocab_and_output_stays_lossless(
    small_head, tiny_target, prompts
):
    cache = new_context_cache(small_head, 2, 64)
    cache.advance(torch.tensor([4, 4]))
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        tokens, _ = propose(small_head, tiny_target, cache, torch.tensor([3, 4]), 7, params)
        assert (tokens % 2 == 0).all() and (tokens < 2 * DRAFT_VOCAB).all()
    plain = generate(tiny_target, prompts, 24).tokens
    assert generate(tiny_target, prompts, 24, drafter=small_head).tokens == plain


def test_checkpoint_keeps_the_head_and_an_int64_d2t(small_head, tmp_path):
    path = save_drafter(small_head, tmp_path / "d")
    config = json.loads((path / "config.json").read_text())
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["vocab_size"] == VOCAB
    state = load_file(path / "model.safetensors")
    assert state["d2t"].dtype == torch.int64 and state["lm_head.weight"].shape[0] == DRAFT_VOCAB
    loaded = load_drafter(path)
    assert loaded.own_head and torch.equal(loaded.d2t, small_head.d2t)
    torch.testing.assert_close(loaded.lm_head.weight, small_head.lm_head.weight.bfloat16().float())

    state["d2t"] = torch.full((DRAFT_VOCAB,), VOCAB, dtype=torch.int64)  # maps past the vocab
    save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError, match="d2t"):
        load_drafter(path)


def test_config_checks_the_draft_vocab_size(tiny_hf):
    with pytest.raises(ValueError, match="draft_vocab_size"):
        DFlashConfig.for_target(tiny_hf.config, mask_token_id=1, draft_vocab_size=VOCAB + 1)
    full = DFlashConfig.for_target(tiny_hf.config, mask_token_id=1).to_hf_dict()
    assert "draft_vocab_size" not in full
    assert DFlashConfig.from_hf_dict({**full, "draft_vocab_size": VOCAB}).draft_vocab_size is None


def test_out_of_vocab_labels_have_no_loss_and_count_as_misses():
    hidden = torch.randn(1, 3, 4, requires_grad=True)
    head = torch.randn(5, 4)
    labels = torch.tensor([[IGNORE, OUT_OF_VOCAB, 2]])
    loss, correct, valid = block_loss(hidden, head, labels, position_weights(3, 4.0))
    assert valid.tolist() == [0, 1, 1] and correct[1] == 0
    loss.backward()
    assert hidden.grad[0, 1].abs().sum() == 0 and hidden.grad[0, 2].abs().sum() > 0


def test_reduced_head_trains(small_head, tiny_target, tmp_path):
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 90, (4,), generator=g).tolist() for _ in range(16)]
    outs = generate(tiny_target, prompts, 32).tokens
    records = [{"prompt_ids": p, "response_ids": o} for p, o in zip(prompts, outs, strict=True)]
    ids, _ = select_draft_vocab(outs, VOCAB, DRAFT_VOCAB)
    small_head.set_draft_vocab(ids, tiny_target.lm_head.weight.detach())
    feats = tmp_path / "feats"
    extract_features(
        tiny_target, records, small_head.config.target_layer_ids, feats, progress=False
    )
    tc = TrainConfig(
        steps=60, batch_size=4, blocks_per_seq=8, lr=3e-3, warmup_steps=5, log_every=20
    )
    head_before = small_head.lm_head.weight.detach().clone()
    train(small_head, tiny_target, FeatureStore(feats), tc, tmp_path / "run", progress=False)
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
    assert not torch.equal(small_head.lm_head.weight, head_before)  # its own head trains
    assert generate(tiny_target, prompts[:4], 16, drafter=small_head).tokens == [
        o[:16] for o in outs[:4]
    ]


def test_warm_start_copies_a_saved_drafter_but_keeps_the_reduced_head(
    small_head, tiny_drafter, tiny_hf, tmp_path
):
    from dflash.train.trainer import warm_start_from

    saved = save_drafter(tiny_drafter, tmp_path / "shipped", dtype=torch.float32)
    head = small_head.lm_head.weight.detach().clone()
    assert warm_start_from(small_head, saved)
    torch.testing.assert_close(small_head.fc.weight, tiny_drafter.fc.weight)
    torch.testing.assert_close(
        small_head.layers[1].mlp.up_proj.weight, tiny_drafter.layers[1].mlp.up_proj.weight
    )
    assert torch.equal(small_head.lm_head.weight, head)
    other = DFlashDrafter(
        DFlashConfig.for_target(tiny_hf.config, mask_token_id=VOCAB - 1, num_hidden_layers=1)
    )
    before = other.fc.weight.detach().clone()
    assert not warm_start_from(other, saved) and torch.equal(other.fc.weight, before)


def test_warm_start_copies_the_reduced_heads_rows_of_the_shared_draft_tokens(
    small_head, tiny_hf, tmp_path
):
    from dflash.train.trainer import warm_start_from

    torch.manual_seed(4)
    ids = torch.randperm(VOCAB)[: len(small_head.d2t)]
    small_head.set_draft_vocab(ids, torch.randn(VOCAB, small_head.config.hidden_size))
    saved = save_drafter(small_head, tmp_path / "shipped", dtype=torch.float32)
    same = DFlashDrafter(small_head.config)
    same.set_draft_vocab(ids, torch.zeros(VOCAB, small_head.config.hidden_size))
    assert warm_start_from(same, saved)
    torch.testing.assert_close(same.lm_head.weight, small_head.lm_head.weight)
    # a recounted vocabulary: the rows of the tokens both hold are copied, the rest kept
    recounted = torch.arange(len(ids))
    other = DFlashDrafter(small_head.config)
    other.set_draft_vocab(recounted, torch.zeros(VOCAB, small_head.config.hidden_size))
    assert warm_start_from(other, saved)
    saved_row = {int(t): i for i, t in enumerate(ids.sort().values)}
    both = [j for j, t in enumerate(recounted.tolist()) if t in saved_row]
    assert 0 < len(both) < len(recounted)
    for j, t in enumerate(recounted.tolist()):
        want = small_head.lm_head.weight[saved_row[t]] if t in saved_row else torch.zeros(1)
        torch.testing.assert_close(other.lm_head.weight[j], want.expand_as(other.lm_head.weight[j]))


def test_a_deeper_drafter_grows_from_a_saved_one_and_drafts_what_it_did(
    tiny_drafter, tiny_target, tiny_hf, prompts, tmp_path
):
    from dataclasses import replace

    from dflash.train.trainer import grown_layers, warm_start_from

    saved = save_drafter(tiny_drafter, tmp_path / "shipped", dtype=torch.float32)
    layers = tiny_drafter.config.num_hidden_layers
    deeper = DFlashDrafter(replace(tiny_drafter.config, num_hidden_layers=layers + 1)).eval()
    assert warm_start_from(deeper, saved)
    added = deeper.layers[layers]
    assert not added.self_attn.o_proj.weight.any() and not added.mlp.down_proj.weight.any()
    torch.testing.assert_close(added.mlp.up_proj.weight, tiny_drafter.layers[-1].mlp.up_proj.weight)
    # the added layer leaves the residual stream alone: the same drafts, so the same acceptance
    before = generate(tiny_target, prompts, 24, drafter=tiny_drafter)
    after = generate(tiny_target, prompts, 24, drafter=deeper)
    assert after.tokens == before.tokens
    assert after.stats.acceptance_lengths == before.stats.acceptance_lengths
    assert grown_layers(tiny_drafter.state_dict(), layers) is not None  # nothing to grow
    assert set(grown_layers({"fc.weight": torch.zeros(1)}, 3)) == {"fc.weight"}

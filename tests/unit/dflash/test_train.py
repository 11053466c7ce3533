"""Drafter training pieces: anchors, masks, loss weights, and a short run that learns."""

from __future__ import annotations

import json

import pytest
import torch

from dflash.config import DFlashConfig
from dflash.generate import generate
from dflash.model import DFlashDrafter
from dflash.train.features import FeatureStore, extract_features
from dflash.train.loss import position_weights
from dflash.train.masks import IGNORE, block_inputs, sample_anchors, training_mask
from dflash.train.prompts import (
    Prompt,
    chat_prompt_ids,
    check_disjoint,
    heldout_prompts,
    training_prompts,
)
from dflash.train.trainer import TrainConfig, init_from_target, train


def test_anchors_stay_in_the_response():
    g = torch.Generator().manual_seed(0)
    anchors = sample_anchors(start=10, length=30, num_blocks=8, generator=g)
    assert anchors.min() >= 9 and anchors.max() <= 28 and len(set(anchors.tolist())) == 8
    few = sample_anchors(start=10, length=12, num_blocks=8, generator=g)
    assert set(few.tolist()) <= {9, 10}
    with pytest.raises(ValueError):
        sample_anchors(start=5, length=5, num_blocks=2, generator=g)


def test_block_inputs_and_labels():
    tokens = torch.arange(100, 110)
    inputs, positions, labels = block_inputs(
        tokens, torch.tensor([2, 8]), block_size=4, mask_token_id=0
    )
    assert inputs.tolist() == [[102, 0, 0, 0], [108, 0, 0, 0]]
    assert positions.tolist() == [[2, 3, 4, 5], [8, 9, 10, 11]]
    assert labels.tolist() == [[IGNORE, 103, 104, 105], [IGNORE, 109, IGNORE, IGNORE]]


def test_training_mask_sees_context_before_anchor_and_own_block_only():
    mask = training_mask(torch.tensor([1, 3]), context_len=4, block_size=2)
    assert mask.tolist() == [
        [True, False, False, False, True, True, False, False],
        [True, False, False, False, True, True, False, False],
        [True, True, True, False, False, False, True, True],
        [True, True, True, False, False, False, True, True],
    ]


def test_position_weights_decay():
    w = position_weights(5, gamma=2.0)
    assert w[0] == 0 and w[1] == 1 and all(w[i] > w[i + 1] for i in range(1, 4))


def test_training_and_heldout_prompts_are_disjoint():
    train_set, held = training_prompts(500), heldout_prompts()
    check_disjoint(train_set, held)
    assert {p.source for p in train_set} == {"math", "code", "chat"}
    assert any(p.source == "humaneval" for p in held)
    with pytest.raises(ValueError, match="leaked"):
        check_disjoint(train_set + held[:1], held)


def test_short_training_run_learns_the_target(tiny_target, tmp_path):
    """Train on the tiny target's own greedy outputs: loss falls, acceptance rises, resume works."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 90, (4,), generator=g).tolist() for _ in range(24)]
    outs = generate(tiny_target, prompts, 40).tokens
    records = [{"prompt_ids": p, "response_ids": o} for p, o in zip(prompts, outs, strict=True)]
    cfg = DFlashConfig.for_target(
        tiny_target.config, mask_token_id=95, block_size=8, num_hidden_layers=1
    )
    extract_features(
        tiny_target,
        records,
        cfg.target_layer_ids,
        tmp_path / "feats",
        shard_size=10,
        progress=False,
    )
    store = FeatureStore(tmp_path / "feats")
    assert len(store) == 24 and store.features[0].shape[-1] == len(cfg.target_layer_ids) * 64

    drafter = DFlashDrafter(cfg)
    init_from_target(drafter, tiny_target, [3])
    before = generate(tiny_target, prompts[:6], 24, drafter=drafter.eval()).stats.tau
    tc = TrainConfig(
        steps=120,
        batch_size=4,
        blocks_per_seq=8,
        lr=3e-3,
        warmup_steps=10,
        log_every=20,
        checkpoint_every=60,
    )
    train(drafter, tiny_target, store, tc, tmp_path / "run", progress=False)
    log = [
        json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()
    ]
    # the tiny target's LM head has flat logits, so accuracy (not CE) is what moves a lot
    assert log[-1]["loss"] < log[0]["loss"]
    assert log[-1]["acc_per_position"][0] > log[0]["acc_per_position"][0] + 0.2
    spec = generate(tiny_target, prompts[:6], 24, drafter=drafter)
    assert spec.tokens == generate(tiny_target, prompts[:6], 24).tokens
    assert spec.stats.tau > before + 0.5

    tc.steps = 140  # resume from the step-120 checkpoint and continue
    train(drafter, tiny_target, store, tc, tmp_path / "run", progress=False)
    log = [
        json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()
    ]
    assert log[-1]["step"] == 140 and len(log) == 7


def test_chat_prompt_ids_templates_one_message_or_a_whole_chat():
    class Template:
        def apply_chat_template(self, messages, add_generation_prompt, return_dict):
            assert add_generation_prompt and not return_dict
            return (*(len(m["content"]) for m in messages), 0)  # 0: "assistant:"

    chat = Prompt("p", "chat", "last", json.dumps([{"role": "user", "content": "ab"}] * 2))
    assert chat_prompt_ids(Template(), "hello") == [5, 0]
    assert chat_prompt_ids(Template(), chat.chat()) == [2, 2, 0]

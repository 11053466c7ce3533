"""Drafter training for small blocks: every anchor, length-grouped batches, top-k
distillation, held-out acceptance per checkpoint, and a learning-rate curve a resume keeps."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from dflash.config import DFlashConfig
from dflash.generate import generate
from dflash.model import DFlashDrafter
from dflash.train.batches import length_groups, make_batch, rows_for_step
from dflash.train.features import FeatureStore, extract_features
from dflash.train.heldout import (
    accepted_per_anchor,
    greedy_records,
    teacher_forced_acceptance,
)
from dflash.train.loss import OUT_OF_VOCAB, block_loss, position_weights, soft_cross_entropy
from dflash.train.masks import IGNORE, all_anchors
from dflash.train.trainer import TrainConfig, _lr, init_from_target, train


def test_all_anchors_cover_every_response_position():
    assert all_anchors(start=10, length=14).tolist() == [9, 10, 11, 12]
    assert all_anchors(start=0, length=3).tolist() == [0, 1]
    with pytest.raises(ValueError):
        all_anchors(start=5, length=5)


def test_length_groups_keep_the_budget_and_an_epoch_visits_every_sequence_once():
    anchors = [5, 50, 6, 48, 100, 7, 52, 99]
    contexts = [a + 20 for a in anchors]
    groups = length_groups(anchors, contexts, budget=200)
    assert sorted(i for g in groups for i in g) == list(range(8))
    for g in groups:
        longest = max(anchors[i] for i in g) * (1 + max(contexts[i] for i in g) / 256)
        assert len(g) == 1 or len(g) * longest <= 200
        assert max(anchors[i] for i in g) <= 2 * min(anchors[i] for i in g) + 5  # similar
    epoch0 = [tuple(rows_for_step(groups, s, seed=3)) for s in range(len(groups))]
    assert sorted(epoch0) == sorted(tuple(g) for g in groups)
    epoch1 = [tuple(rows_for_step(groups, s, seed=3)) for s in range(len(groups), 2 * len(groups))]
    assert sorted(epoch1) == sorted(epoch0) and epoch1 != epoch0  # reshuffled per epoch
    assert rows_for_step(groups, 5, seed=3) == rows_for_step(groups, 5, seed=3)  # resumable


class _Store:
    """FeatureStore's interface over in-memory tensors."""

    def __init__(self, seqs, starts, dim=4, k=2):
        self.tokens = [torch.tensor(s) for s in seqs]
        self.starts = starts
        self.features = [torch.randn(len(s), dim) for s in seqs]
        self.topk_ids = [torch.stack([t, t + 1], dim=1).int() for t in self.tokens]
        self.topk_logp = [torch.log(torch.tensor([[0.75, 0.25]] * len(s))) for s in seqs]
        self.has_topk = True

    def __len__(self):
        return len(self.tokens)


def test_every_anchor_batch_pads_shorter_rows_with_ignored_blocks_and_aligns_soft_labels():
    store = _Store([[1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13]], starts=[3, 2])
    embed = torch.randn(32, 4)
    batch = make_batch(
        store, [0, 1], 3, 0, embed, blocks_per_seq=None, generator=torch.Generator(), soft=True
    )
    assert batch.labels.shape == (2, 4, 3)  # anchors 2..5 and 1..2, padded to the longer row
    assert batch.labels[0].tolist() == [
        [IGNORE, 4, 5],
        [IGNORE, 5, 6],
        [IGNORE, 6, 7],
        [IGNORE, 7, IGNORE],
    ]
    row1 = batch.labels[1]
    assert row1[:2].tolist() == [[IGNORE, 12, 13], [IGNORE, 13, IGNORE]]
    assert (row1[2:] == IGNORE).all()  # padding blocks teach nothing
    # the soft label of block position j is the target's top-k at anchor + j - 1: its top
    # id (as built here) is the token at that position, i.e. the hard label shifted back
    ids = batch.soft_ids[0, 0, 1:, 0].tolist()
    assert ids == [3, 4]  # anchor 2 (token 3): positions 1, 2 predict tokens 4, 5 from 3, 4
    assert batch.mask[:, 0].any(dim=-1).all()  # no query row sees nothing


def test_soft_cross_entropy_is_hard_ce_on_a_one_hot_and_drops_ids_the_head_lacks():
    logits = torch.randn(3, 6)
    one_hot = torch.tensor([[0.0, -1e9]] * 3)
    ids = torch.tensor([[2, 4], [1, 0], [5, 3]])
    assert torch.allclose(
        soft_cross_entropy(logits, ids, one_hot),
        F.cross_entropy(logits, ids[:, 0], reduction="none"),
    )
    both = torch.log(torch.tensor([[0.5, 0.5]]))
    lacking = soft_cross_entropy(logits[:1], torch.tensor([[OUT_OF_VOCAB, 4]]), both)
    assert torch.allclose(lacking, -logits[0].log_softmax(-1)[4:5])
    none = soft_cross_entropy(logits[:1], torch.tensor([[OUT_OF_VOCAB, OUT_OF_VOCAB]]), both)
    assert none.item() == 0.0


def test_distillation_mixes_the_soft_term_into_the_block_loss():
    torch.manual_seed(0)
    hidden, head = torch.randn(2, 3, 4), torch.randn(6, 4)
    labels = torch.tensor([[IGNORE, 1, 2], [IGNORE, 3, IGNORE]])
    weights = position_weights(3, 4.0)
    soft_ids = torch.tensor([[[0, 0], [1, 5], [2, 4]], [[0, 0], [3, 1], [0, 0]]])
    soft_logp = torch.log(torch.tensor([0.6, 0.4])).expand(2, 3, 2)
    hard, _, _ = block_loss(hidden, head, labels, weights)
    same, _, _ = block_loss(hidden, head, labels, weights, soft=(soft_ids, soft_logp), distill=0)
    mixed, _, _ = block_loss(hidden, head, labels, weights, soft=(soft_ids, soft_logp), distill=1)
    assert same == hard and not math.isclose(mixed.item(), hard.item())
    logits = F.linear(hidden[:, 1:], head)
    w = weights[1:] * (labels[:, 1:] != IGNORE)
    expected = (
        soft_cross_entropy(
            logits.reshape(4, 6), soft_ids[:, 1:].reshape(4, 2), soft_logp[:, 1:].reshape(4, 2)
        ).view(2, 2)
        * w
    ).sum() / w.sum()
    assert torch.allclose(mixed, expected)


def test_a_resumed_run_keeps_the_learning_rate_curve_of_its_first_start():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert _lr(cfg, 99) > 0.1 and math.isclose(_lr(cfg, 150, total=100), 0.1)
    longer = TrainConfig(steps=200, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert _lr(longer, 99, total=100) == _lr(cfg, 99)  # not the 200-step curve


@pytest.fixture(scope="module")
def tiny_data(tiny_target, tmp_path_factory):
    """Greedy responses of the tiny target with features and top-4 log-probabilities."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 90, (n,), generator=g).tolist() for n in [3, 5, 4, 6] * 6]
    records = greedy_records(tiny_target, prompts, stop_id=-1, max_new_tokens=30)
    assert [r["prompt_ids"] for r in records] == prompts
    cfg = DFlashConfig.for_target(
        tiny_target.config, mask_token_id=95, block_size=4, num_hidden_layers=1
    )
    root = tmp_path_factory.mktemp("tiny")
    extract_features(
        tiny_target, records[:20], cfg.target_layer_ids, root / "train", topk=4, progress=False
    )
    extract_features(
        tiny_target, records[20:], cfg.target_layer_ids, root / "held", topk=4, progress=False
    )
    return cfg, prompts, FeatureStore(root / "train"), FeatureStore(root / "held"), root


def test_topk_features_hold_the_target_distribution(tiny_target, tiny_data):
    _, _, store, _, _ = tiny_data
    assert store.has_topk and store.topk_ids[0].shape == (len(store.tokens[0]), 4)
    tokens = store.tokens[0]
    logits = tiny_target(tokens[None], tiny_target.new_cache(1, len(tokens))).logits[0]
    assert torch.equal(store.topk_ids[0][:, 0].long(), logits.argmax(-1))
    # greedy responses: the top-1 id at position t is the response's token t + 1
    start = store.starts[0]
    assert torch.equal(store.topk_ids[0][start - 1 : -1, 0].long(), tokens[start:])


def test_teacher_forced_acceptance_is_what_the_reference_loop_accepts(tiny_target, tiny_data):
    """Per anchor, the offline measure equals the accepted drafts of the real speculative
    loop started at that anchor (features of the positions before it, greedy verification)."""
    cfg, _, _, held, _ = tiny_data
    torch.manual_seed(2)
    drafter = DFlashDrafter(cfg).float().eval()
    init_from_target(drafter, tiny_target, [3])
    embed = tiny_target.embed_tokens.weight.detach().float()
    head = tiny_target.lm_head.weight.detach()
    checked = 0
    for r in range(3):
        tokens, start = held.tokens[r], held.starts[r]
        anchors, accepted = accepted_per_anchor(
            drafter, tokens, start, held.features[r], embed, head, 3
        )
        for a, n in zip(anchors.tolist(), accepted.tolist(), strict=True):
            if a < start:
                continue  # the loop's first anchor is the first response token
            out = generate(
                tiny_target, [tokens[:a].tolist()], 5, drafter=drafter, num_draft_tokens=3
            )
            assert out.stats.acceptance_lengths[0] - 1 == n, (r, a)
            checked += 1
    assert checked >= 20


def test_all_anchor_training_with_distillation_raises_heldout_acceptance(
    tiny_target, tiny_data, tmp_path
):
    cfg, _, store, held, _ = tiny_data
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    init_from_target(drafter, tiny_target, [3])
    tc = TrainConfig(
        steps=60,
        lr=3e-3,
        warmup_steps=5,
        log_every=20,
        checkpoint_every=30,
        anchors="all",
        step_budget=400,
        distill=0.5,
        gamma=2.0,
        block_sizes=(3, 4),  # blocks of 3 and 4 in turn: k = 2 and 3
    )
    train(drafter, tiny_target, store, tc, tmp_path / "run", progress=False, heldout=held)
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    heldout = [r["heldout"][-1] for r in log if "heldout" in r]  # k = 3 (blocks of 4)
    assert [h["k"] for h in log[-1]["heldout"]] == [2, 3]
    assert [r["step"] for r in log if "heldout" in r] == [30, 60]
    losses = [r["loss"] for r in log if "loss" in r]
    assert losses[-1] < losses[0]
    embed = tiny_target.embed_tokens.weight.detach().float()
    fresh = DFlashDrafter(cfg).float()
    init_from_target(fresh, tiny_target, [3])
    before = teacher_forced_acceptance(fresh, held, embed, tiny_target.lm_head.weight.detach())
    assert heldout[-1]["p1"] > before["p1"] + 0.1
    assert heldout[-1]["tau"] == pytest.approx(
        1 + sum(heldout[-1]["position_acceptance"]), abs=1e-3
    )
    config = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert config["schedule_steps"] == 60 and config["anchors"] == "all"


def test_distillation_without_topk_features_is_refused(tiny_target, tmp_path):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 90, (4,), generator=g).tolist() for _ in range(3)]
    records = greedy_records(tiny_target, prompts, stop_id=-1, max_new_tokens=8)
    cfg = DFlashConfig.for_target(
        tiny_target.config, mask_token_id=95, block_size=4, num_hidden_layers=1
    )
    extract_features(tiny_target, records, cfg.target_layer_ids, tmp_path / "f", progress=False)
    with pytest.raises(ValueError, match="top-k"):
        train(
            DFlashDrafter(cfg),
            tiny_target,
            FeatureStore(tmp_path / "f"),
            TrainConfig(steps=1, distill=0.5),
            tmp_path / "run",
            progress=False,
        )

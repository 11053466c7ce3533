"""DFlash drafter training: data -> features -> train -> export, each stage resumable.

Reproduces the shipped DFlash drafter for the bundled model end to end on a CPU:
  data      prompts (seeded + written by the model), target responses via vLLM
  features  target hidden states at the drafter's layers, bf16 shards
  train     drafter training with checkpoints (train_log.jsonl holds the curve)
  export    vLLM-format drafter directory + model card
Every stage skips work already on disk, so rerunning the command continues a stopped job.
`agentserve train-drafter` runs it (docs/dflash-training.md); what the serving side knows of
the target model comes in a TargetInfo, so nothing here imports agentserve.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash.config import DFlashConfig
from dflash.train.card import card_for_run, card_line
from dflash.train.data_stage import DATA_MAX_MODEL_LEN, restore_responses, stage_data
from dflash.train.eval_stage import heldout_store, stage_eval
from dflash.train.options import STAGES
from dflash.train.responses import load_responses

__all__ = ["TargetInfo", "run"]


@dataclass(frozen=True)
class TargetInfo:
    """The target model as its server knows it."""

    model_dir: Path
    """its local Hugging Face directory"""
    mask_token_id: Callable[[Any], int]
    """tokenizer -> the mask token of a new drafter"""
    shipped_drafter: Path | None
    """the drafter shipped for it: warm start, `--stage eval`'s default"""
    export_dir: Path
    """where `--stage export` writes when `--out` is not given"""
    responses_archive: Path | None
    """committed training responses a fresh work dir starts from, if any"""


def _record_command(work: Path, stages: tuple[str, ...]) -> None:
    """Keep the exact command that ran each stage (the model card quotes them)."""
    import shlex
    import sys

    command = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    for stage in stages:
        (work / f"{stage}.command").write_text(command + "\n")


def _drafter_config(args: argparse.Namespace, info: TargetInfo, target, tokenizer):
    return DFlashConfig.for_target(
        target.config,
        mask_token_id=info.mask_token_id(tokenizer),
        block_size=args.block_size,
        num_hidden_layers=args.layers,
        draft_vocab_size=args.draft_vocab or None,
    )


def _warm_start(args: argparse.Namespace, info: TargetInfo, drafter, target) -> None:
    """Initialise the drafter before step 0 (a resumed run loads its checkpoint instead)."""
    from dflash.train.trainer import init_from_target, warm_start_from  # lazy: torch

    choice = args.init_from
    if choice == "shipped":
        source = info.shipped_drafter
        if source is not None and warm_start_from(drafter, source):
            what = f"the previously shipped drafter's weights ({card_line(source)})"
            _note_warm_start(args, what + _growth(source, args))
            return
        choice = "28,29"
    if choice and Path(choice).is_dir():
        if not warm_start_from(drafter, Path(choice)):
            raise ValueError(f"--init-from {choice}: drafter shape does not match")
        _note_warm_start(
            args, f"drafter {choice} ({card_line(Path(choice))}){_growth(Path(choice), args)}"
        )
    elif choice:
        init_from_target(drafter, target, [int(i) for i in choice.split(",")])
        _note_warm_start(args, f"target layers {choice}")


def _growth(source: Path, args: argparse.Namespace) -> str:
    """ ", grown from N to M layers" when the drafter has more layers than `source`."""
    try:
        have = json.loads((source / "config.json").read_text())["num_hidden_layers"]
    except (OSError, ValueError, KeyError):
        return ""
    return f", grown from {have} to {args.layers} layers" if have < args.layers else ""


def _note_warm_start(args: argparse.Namespace, what: str) -> None:
    path = Path(args.work_dir) / "train" / "warm_start.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():  # a resumed run keeps the note of its first start
        path.write_text(what + "\n")
    print(f"warm start: {what}")


def _set_draft_vocab(drafter, target, tokenizer, records: list[dict]) -> None:
    from dflash.train.trainer import select_draft_vocab  # lazy: torch

    always = tuple(sorted({i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i}))
    ids, covered = select_draft_vocab(
        (r["response_ids"] for r in records), drafter.config.vocab_size, len(drafter.d2t), always
    )
    drafter.set_draft_vocab(ids, target.lm_head.weight.detach().float())
    print(f"draft vocabulary: {len(ids)} tokens cover {covered:.1%} of response tokens")


def _train_blocks(args: argparse.Namespace) -> tuple[int, ...]:
    try:
        sizes = tuple(int(b) for b in args.train_blocks.split(",") if b.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(not 2 <= b <= args.block_size for b in sizes):
        raise SystemExit(
            f"--train-blocks {args.train_blocks!r}: block sizes within 2..--block-size "
            f"({args.block_size}), comma-separated"
        )
    return sizes


def _features_dir(args: argparse.Namespace, work: Path) -> Path:
    """Features with top-k log-probabilities live apart from plain ones (no shard mix)."""
    return work / (f"features-top{args.topk}" if args.topk else "features")


def run(args: argparse.Namespace, info: TargetInfo) -> int:
    """Run the stages `args.stage` names (all four by default; eval alone) for one target."""
    import torch
    from transformers import AutoTokenizer

    model_dir = info.model_dir
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    stages = STAGES if args.stage == "all" else (args.stage,)
    _record_command(work, stages)
    restore_responses(info.responses_archive, work)
    if "data" in stages:
        stage_data(args, model_dir, work)
    if args.stage == "eval":
        return stage_eval(args, model_dir, work, info.shipped_drafter)
    if not set(stages) & {"features", "train", "export"}:
        return 0

    # lazy: torch, and only for these stages
    from dflash.export import save_drafter
    from dflash.model import DFlashDrafter
    from dflash.target import load_target
    from dflash.train.features import FeatureStore, extract_features, feature_order
    from dflash.train.trainer import TrainConfig, train

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = load_target(str(model_dir), dtype=torch.bfloat16)
    cfg = _drafter_config(args, info, target, tokenizer)
    records = [r for r in load_responses(work / "responses.jsonl") if r["response_ids"]]
    features = _features_dir(args, work)
    # a seeded shuffle, stable as the data grows: any prefix of the feature shards is a
    # representative mix, so training can start on the shards done so far
    records = feature_order(records, features, args.seed, DATA_MAX_MODEL_LEN)
    if "features" in stages:
        if not records:
            raise FileNotFoundError(f"no responses in {work}: run --stage data first")
        extract_features(
            target,
            records,
            cfg.target_layer_ids,
            features,
            max_len=DATA_MAX_MODEL_LEN,
            shard_size=64,  # ~1-2 min of work each: a stopped job loses little
            topk=args.topk,
        )
    drafter = DFlashDrafter(cfg)
    if "train" in stages:
        if drafter.own_head:
            _set_draft_vocab(drafter, target, tokenizer, records)
        _warm_start(args, info, drafter, target)
        tc = TrainConfig(
            steps=args.steps,
            batch_size=args.batch_size,
            blocks_per_seq=args.blocks_per_seq,
            anchors=args.anchors,
            step_budget=args.step_budget,
            distill=args.distill if args.topk else 0.0,
            lr=args.lr,
            gamma=args.gamma,
            seed=args.seed,
            checkpoint_every=args.checkpoint_every,
            block_sizes=_train_blocks(args),
        )
        heldout = heldout_store(args, work, target, tokenizer, cfg.target_layer_ids)
        train(drafter, target, FeatureStore(features), tc, work / "train", heldout=heldout)
    if "export" in stages:
        state = torch.load(work / "train" / "checkpoint.pt", weights_only=False)
        drafter.load_state_dict(state["drafter"])
        out = Path(args.out) if args.out else info.export_dir
        shard_bytes = int(args.max_shard_mib * 2**20) if args.max_shard_mib > 0 else None
        save_drafter(drafter, out, max_shard_bytes=shard_bytes)
        card_for_run(
            out,
            work,
            target,
            drafter.to(target.dtype).eval(),
            tokenizer,
            state["step"],
            eval_prompts=args.eval_prompts,
            stages=STAGES,
            features=features,
        )
        print(f"exported drafter (step {state['step']}) to {out}")
    return 0

"""`agentserve train-drafter`: data -> features -> train -> export, each stage resumable.

Reproduces the shipped DFlash drafter for the bundled model end to end on a CPU:
  data      prompts (seeded + written by the model), target responses via vLLM
  features  target hidden states at the drafter's layers, bf16 shards
  train     drafter training with checkpoints (train_log.jsonl holds the curve)
  export    vLLM-format drafter directory + model card
Every stage skips work already on disk, so rerunning the command continues a stopped job.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentserve.cli.train_drafter_data import (
    DATA_MAX_MODEL_LEN,
    restore_responses,
    stage_data,
)
from agentserve.cli.train_drafter_eval import heldout_store, stage_eval
from agentserve.drafters import BUNDLED_DRAFTER_DIR, mask_token_id_for, shipped_drafter
from agentserve.sources.models import BUNDLED_MODEL, resolve_model
from dflash.config import DFlashConfig
from dflash.train.card import card_for_run, card_line
from dflash.train.responses import load_responses

__all__ = ["add_parser", "run"]

STAGES = ("data", "features", "train", "export")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-drafter",
        help="train a DFlash drafter for a model (default: the bundled one), resumable",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default=BUNDLED_MODEL,
        help="target model: the bundled model's name or a local HF dir (default: %(default)s)",
    )
    p.add_argument(
        "--work-dir",
        default="runs/drafter-smollm2",
        help="data, features, checkpoints (default: %(default)s)",
    )
    p.add_argument(
        "--stage",
        choices=(*STAGES, "all", "eval"),
        default="all",
        help="run one stage or all; eval (not part of all) prints the held-out greedy "
        "acceptance at k = 3 and 4 of the drafter at --drafter (default: %(default)s)",
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="--stage eval: the drafter directory to evaluate (default: the shipped one)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="export directory (default: the shipped drafter's directory for the bundled "
        "model, inside the installed package: in a checkout that overwrites tracked files; "
        "give a directory to keep the shipped drafter)",
    )
    p.add_argument(
        "--max-shard-mib",
        type=float,
        default=16.0,
        help="export: split the weights into Hugging Face shards of at most this size, "
        "which keeps every file small enough for a git repository; 0 = one file "
        "(default: %(default)s)",
    )
    data = p.add_argument_group("data")
    data.add_argument(
        "--num-prompts",
        type=int,
        default=4000,
        help="seeded training prompts (default: %(default)s)",
    )
    data.add_argument(
        "--self-written",
        type=int,
        default=600,
        help="prompts the model writes itself (default: %(default)s)",
    )
    data.add_argument(
        "--code-prompts",
        type=int,
        default=6000,
        help="complete/fix/explain/edit prompts over real third-party code from site-packages "
        "(never the stdlib or HumanEval) (default: %(default)s)",
    )
    data.add_argument(
        "--agent-prompts",
        type=int,
        default=3000,
        help="agent-style prompts: tool output to summarise as JSON, multi-turn exchanges "
        "quoting tool results, tool-call generation (default: %(default)s)",
    )
    data.add_argument(
        "--max-tokens", type=int, default=256, help="response length cap (default: %(default)s)"
    )
    data.add_argument(
        "--sampled-fraction",
        type=float,
        default=0.0,
        help="responses sampled at T=0.8 instead of greedy (default: %(default)s: greedy "
        "labels, which is what greedy verification accepts)",
    )
    model = p.add_argument_group("drafter")
    model.add_argument(
        "--layers", type=int, default=2, help="drafter layers (default: %(default)s)"
    )
    model.add_argument(
        "--block-size",
        type=int,
        default=5,
        help="block size: the anchor + block_size - 1 drafted tokens, the most serving may "
        "propose (num_speculative_tokens); a CPU verifies 3-4 drafts at about the cost of one "
        "decode step, more cost more (default: %(default)s)",
    )
    model.add_argument(
        "--train-blocks",
        default="4,5",
        help="block sizes trained in turn, one per step: serving with k drafts runs a block "
        "of k + 1 slots, so a drafter served at k=3 (DFlash) and k=4 (hybrid) trains on both "
        "(default: %(default)s)",
    )
    model.add_argument(
        "--draft-vocab",
        type=int,
        default=8192,
        help="rows of the drafter's own LM head: the most frequent tokens of the training "
        "responses, exported with vLLM's d2t map; 0 = share the target's full head "
        "(default: %(default)s)",
    )
    model.add_argument(
        "--init-from",
        default="shipped",
        help="warm start: 'shipped' (the shipped drafter's weights, when its shape matches; "
        "else target layers 28,29), a drafter directory, comma-separated target layers, or '' "
        "(random) (default: %(default)s)",
    )
    p.add_argument(
        "--topk",
        type=int,
        default=8,
        help="features: also keep the target's top-k next-token log-probabilities per "
        "position, the soft labels of --distill; 0 = none (default: %(default)s)",
    )
    train = p.add_argument_group("training")
    train.add_argument(
        "--steps",
        type=int,
        default=3000,
        help="step total; the learning-rate curve ends there, and a resumed run keeps the "
        "total of its first start (a larger value goes on at the final rate) "
        "(default: %(default)s)",
    )
    train.add_argument(
        "--anchors",
        choices=("all", "sampled"),
        default="all",
        help="all: every response position anchors a block, as at inference, sequences of "
        "similar length batched together; sampled: --blocks-per-seq random anchors in "
        "--batch-size random sequences (default: %(default)s)",
    )
    train.add_argument(
        "--step-budget",
        type=int,
        default=4096,
        help="--anchors all: size of a step, sequences x most anchors x (1 + longest "
        "context / 256) (default: %(default)s)",
    )
    train.add_argument(
        "--batch-size",
        type=int,
        default=4,
        help="--anchors sampled: sequences per step (default: %(default)s)",
    )
    train.add_argument(
        "--blocks-per-seq",
        type=int,
        default=16,
        help="--anchors sampled: anchors per sequence (default: %(default)s)",
    )
    train.add_argument(
        "--distill",
        type=float,
        default=0.5,
        help="weight of distillation on the target's top-k distribution (needs --topk > 0) "
        "against the greedy label's cross-entropy (default: %(default)s)",
    )
    train.add_argument(
        "--checkpoint-every",
        type=int,
        default=200,
        help="steps between checkpoints, each logging the held-out acceptance "
        "(default: %(default)s)",
    )
    train.add_argument(
        "--heldout-prompts",
        type=int,
        default=32,
        help="held-out prompts (half HumanEval, half math) whose greedy responses give the "
        "acceptance logged at every checkpoint; 0 = none (default: %(default)s)",
    )
    train.add_argument(
        "--lr", type=float, default=6e-4, help="peak learning rate (default: %(default)s)"
    )
    train.add_argument(
        "--gamma",
        type=float,
        default=4.0,
        help="loss weight decay over block positions, exp(-(k-1)/gamma) (default: %(default)s)",
    )
    train.add_argument(
        "--seed", type=int, default=0, help="data order and initialisation (default: 0)"
    )
    train.add_argument(
        "--eval-prompts",
        type=int,
        default=32,
        help="held-out prompts (half HumanEval, half math) for the model card's tau "
        "(default: %(default)s)",
    )
    p.set_defaults(handler=run)


def _record_command(work: Path, stages: tuple[str, ...]) -> None:
    """Keep the exact command that ran each stage (the model card quotes them)."""
    import shlex
    import sys

    command = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    for stage in stages:
        (work / f"{stage}.command").write_text(command + "\n")


def _drafter_config(args: argparse.Namespace, target, tokenizer):
    return DFlashConfig.for_target(
        target.config,
        mask_token_id=mask_token_id_for(args.model, tokenizer),
        block_size=args.block_size,
        num_hidden_layers=args.layers,
        draft_vocab_size=args.draft_vocab or None,
    )


def _warm_start(args: argparse.Namespace, drafter, target) -> None:
    """Initialise the drafter before step 0 (a resumed run loads its checkpoint instead)."""
    from dflash.train.trainer import init_from_target, warm_start_from  # lazy: torch

    choice = args.init_from
    if choice == "shipped":
        source = shipped_drafter(args.model)
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


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    model_dir = resolve_model(args.model)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    stages = STAGES if args.stage == "all" else (args.stage,)
    _record_command(work, stages)
    restore_responses(args, work)
    if "data" in stages:
        stage_data(args, model_dir, work)
    if args.stage == "eval":
        return stage_eval(args, model_dir, work)
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
    cfg = _drafter_config(args, target, tokenizer)
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
        _warm_start(args, drafter, target)
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
        out = Path(args.out) if args.out else (shipped_drafter(args.model) or BUNDLED_DRAFTER_DIR)
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

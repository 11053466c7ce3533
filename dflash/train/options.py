"""The options of drafter training (`agentserve train-drafter`, docs/dflash-training.md): one
argparse group per stage, defaults as the shipped drafter was trained."""

from __future__ import annotations

import argparse

__all__ = ["STAGES", "add_arguments"]

STAGES = ("data", "features", "train", "export")


def add_arguments(p: argparse.ArgumentParser, default_model: str) -> None:
    """Add every training option to `p`; `--model` defaults to `default_model`."""
    p.add_argument(
        "--model",
        default=default_model,
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

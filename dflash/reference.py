"""Run prompts through the DFlash reference loop (generate.py) and report tau: the
implementation of `agentserve generate`, which hands in what the server knows of the model
(its weights directory, mask token and shipped drafter), so nothing here imports agentserve.

torch and the dflash modules that import it (all but dflash.config) are imported inside
the functions that run the loop, so building the CLI parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash.config import DFlashConfig
from dflash.train.prompts import chat_prompt_ids

if TYPE_CHECKING:
    from dflash.generate import GenerationResult
    from dflash.model import DFlashDrafter
    from dflash.target import TargetModel

__all__ = ["DEFAULT_PROMPTS", "add_arguments", "load_drafter_choice", "run_reference"]

DEFAULT_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
]


def load_drafter_choice(
    choice: str,
    target: TargetModel,
    tokenizer,
    mask_token_id: Callable[[Any], int],
    shipped: Path | None,
) -> DFlashDrafter | None:
    """'none' | 'random' | 'auto' (`shipped`, else none) | a directory -> a drafter on the
    target's device/dtype; `mask_token_id(tokenizer)` is a random drafter's mask token."""
    import torch

    from dflash.export import load_drafter
    from dflash.model import DFlashDrafter

    if choice == "none":
        return None
    if choice == "random":
        torch.manual_seed(0)
        cfg = DFlashConfig.for_target(target.config, mask_token_id=mask_token_id(tokenizer))
        return DFlashDrafter(cfg).to(target.dtype).eval()
    path = shipped if choice == "auto" else choice
    if path is None:
        return None
    return load_drafter(path, dtype=target.dtype)


def _summary(result: GenerationResult) -> dict[str, Any]:
    s = result.stats
    return {
        "tokens": s.num_tokens,
        "steps": s.num_steps,
        "tokens_per_s": round(s.tokens_per_s, 2),
        "tau": round(s.tau, 3),
        "acceptance_histogram": dict(sorted(Counter(s.acceptance_lengths).items())),
        "per_position_acceptance": [round(a, 3) for a in s.per_position_acceptance],
    }


def run_reference(
    args: argparse.Namespace,
    model_dir: Path,
    mask_token_id: Callable[[Any], int],
    shipped: Path | None,
) -> int:
    """Generate for `args` (add_arguments' options) and print the text and the figures."""
    from transformers import AutoTokenizer

    from dflash.generate import generate
    from dflash.sampling import SamplingParams
    from dflash.target import load_target

    params = SamplingParams(args.temperature, args.top_p, args.top_k)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = load_target(str(model_dir))
    drafter = load_drafter_choice(args.drafter, target, tokenizer, mask_token_id, shipped)
    texts = args.prompts or DEFAULT_PROMPTS
    prompts = [chat_prompt_ids(tokenizer, t) for t in texts]
    run = dict(params=params, stop_token_ids=[tokenizer.eos_token_id], seed=args.seed)
    result = generate(
        target,
        prompts,
        args.max_new_tokens,
        drafter=drafter,
        num_draft_tokens=args.num_draft_tokens,
        **run,
    )
    report: dict[str, Any] = {
        "drafter": "none" if drafter is None else args.drafter,
        "outputs": [tokenizer.decode(t, skip_special_tokens=True) for t in result.tokens],
        **_summary(result),
    }
    if args.compare and drafter is not None:
        plain = generate(target, prompts, args.max_new_tokens, **run)
        report["plain_tokens_per_s"] = round(plain.stats.tokens_per_s, 2)
        report["speedup"] = round(
            result.stats.tokens_per_s / max(plain.stats.tokens_per_s, 1e-9), 3
        )
        report["outputs_identical"] = plain.tokens == result.tokens
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for text, out in zip(texts, report.pop("outputs"), strict=True):
        print(f">>> {text}\n{out}\n")
    for key, value in report.items():
        print(f"{key}: {value}")
    return 0


def add_arguments(p: argparse.ArgumentParser, default_model: str) -> None:
    """Add run_reference's options to `p`; `--model` defaults to `default_model`."""
    p.add_argument(
        "prompts", nargs="*", help="user messages (chat template applied); default: two samples"
    )
    p.add_argument(
        "--model",
        default=default_model,
        help="bundled model name or local HF dir (default: %(default)s)",
    )
    p.add_argument(
        "--drafter",
        default="auto",
        help="drafter directory, 'auto' (the shipped drafter for the bundled model, else none), "
        "'random' (untrained, for checking losslessness) or 'none' (plain decoding)",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help="tokens drafted per step (default: block_size - 1)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=128, help="per prompt (default: %(default)s)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)"
    )
    p.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling mass (default: %(default)s)"
    )
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also run plain decoding and report the speedup and whether outputs match",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

"""Drafter training: the held-out set and `--stage eval`.

The held-out set is the target's greedy responses to held-out prompts (half HumanEval, half
held-out math; never trained on) with their features, built once per work dir and feature
layers. Training logs its greedy acceptance at every checkpoint; `--stage eval` prints the
same figure for any drafter directory, so drafters are compared on one measure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash.train.card import eval_prompt_ids

__all__ = ["heldout_store", "stage_eval"]


def heldout_store(args: argparse.Namespace, work: Path, target, tokenizer, layer_ids):
    """The target's greedy responses to the held-out prompts, with features (built once)."""
    from dflash.train.features import FeatureStore, extract_features  # lazy: torch
    from dflash.train.heldout import greedy_records

    if not args.heldout_prompts:
        return None
    layers = "-".join(str(i) for i in layer_ids)
    directory = work / f"heldout-{args.heldout_prompts}-layers-{layers}"
    if not list(directory.glob("features-*.safetensors")):
        print(f"held-out set: greedy responses to {args.heldout_prompts} held-out prompts")
        prompts = eval_prompt_ids(tokenizer, args.heldout_prompts)
        records = greedy_records(target, prompts, tokenizer.eos_token_id)
        extract_features(target, records, layer_ids, directory, topk=args.topk, progress=False)
    return FeatureStore(directory)


def stage_eval(args: argparse.Namespace, model_dir: Path, work: Path, shipped: Path | None) -> int:
    """Held-out greedy acceptance (teacher-forced over every anchor) of one drafter, as
    training logs it at its checkpoints: the figure to compare drafters by. `--drafter`
    names it, else the drafter `shipped` for the target."""
    import torch
    from transformers import AutoTokenizer

    from dflash.export import load_drafter
    from dflash.target import load_target
    from dflash.train.heldout import teacher_forced_acceptance

    directory = Path(args.drafter) if args.drafter else shipped
    if directory is None:
        raise SystemExit(f"no drafter to evaluate for {args.model}: pass --drafter DIR")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = load_target(str(model_dir), dtype=torch.bfloat16)
    drafter = load_drafter(directory).float().eval()
    args.heldout_prompts = args.heldout_prompts or 32
    held = heldout_store(args, work, target, tokenizer, drafter.config.target_layer_ids)
    embed = target.embed_tokens.weight.detach().float()
    head = (drafter.lm_head if drafter.own_head else target.lm_head).weight.detach()
    ks = [k for k in (3, 4) if k <= drafter.config.block_size - 1]
    result = {
        "drafter": str(directory),
        "block_size": drafter.config.block_size,
        "heldout_prompts": args.heldout_prompts,
        "heldout": [
            {"k": k, **teacher_forced_acceptance(drafter, held, embed, head, k)} for k in ks
        ],
    }
    print(json.dumps(result))
    return 0

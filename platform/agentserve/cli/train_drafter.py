"""`agentserve train-drafter`: DFlash drafter training (dflash/train/pipeline.py, stages data ->
features -> train -> export, resumable; docs/dflash-training.md) for a model this runtime
resolves, with its shipped drafter, mask token and committed responses."""

from __future__ import annotations

import argparse
from functools import partial

from agentserve.drafters import BUNDLED_DRAFTER_DIR, mask_token_id_for, shipped_drafter
from agentserve.sources.models import BUNDLED_MODEL, resolve_model
from dflash.train import pipeline
from dflash.train.data_stage import responses_archive
from dflash.train.options import add_arguments

__all__ = ["add_parser", "run", "target_info"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-drafter",
        help="train a DFlash drafter for a model (default: the bundled one), resumable",
        description=pipeline.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p, default_model=BUNDLED_MODEL)
    p.set_defaults(handler=run)


def target_info(model: str) -> pipeline.TargetInfo:
    """What agentserve knows of `model` that training needs (resolving it converts or
    downloads it once)."""
    shipped = shipped_drafter(model)
    return pipeline.TargetInfo(
        model_dir=resolve_model(model),
        mask_token_id=partial(mask_token_id_for, model),
        shipped_drafter=shipped,
        export_dir=shipped or BUNDLED_DRAFTER_DIR,
        responses_archive=responses_archive(BUNDLED_MODEL) if model == BUNDLED_MODEL else None,
    )


def run(args: argparse.Namespace) -> int:
    return pipeline.run(args, target_info(args.model))

"""`agentserve generate`: prompts through the readable DFlash reference loop (dflash/reference.py)
for a model this runtime resolves, with its mask token and shipped drafter."""

from __future__ import annotations

import argparse
from functools import partial

from agentserve.drafters import mask_token_id_for, shipped_drafter
from agentserve.sources.models import BUNDLED_MODEL, resolve_model
from dflash import reference

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `generate` on the CLI's subparsers."""
    p = sub.add_parser(
        "generate",
        help="generate text with the DFlash reference loop and report acceptance (tau)",
        description="Run prompts through the readable DFlash reference loop (dflash/generate.py) "
        "on CPU or GPU and print the text plus tokens/s, steps and acceptance length tau. "
        "The serving path is vLLM (`agentserve up`); this is for checking and research.",
    )
    reference.add_arguments(p, default_model=BUNDLED_MODEL)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    mask_token_id = partial(mask_token_id_for, args.model)
    model_dir = resolve_model(args.model)
    return reference.run_reference(args, model_dir, mask_token_id, shipped_drafter(args.model))

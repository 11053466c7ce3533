"""`agentserve model prepare`: convert/cache a model's weights once and print the directory."""

from __future__ import annotations

import argparse

from agentserve.sources.models import BUNDLED_MODEL, resolve_model

__all__ = ["add_parser"]


def _cmd_prepare(args: argparse.Namespace) -> int:
    print(resolve_model(args.source, progress=not args.quiet))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `model prepare` on the CLI's subparsers."""
    model = sub.add_parser(
        "model", help="prepare models (convert the bundled GGUF once, check local dirs)"
    )
    model.set_defaults(group_parser=model)  # `agentserve model` alone: its help, exit 2
    model_sub = model.add_subparsers(title="actions", metavar="ACTION")
    prep = model_sub.add_parser("prepare", help="convert/cache the model and print its directory")
    prep.add_argument(
        "source",
        nargs="?",
        default=BUNDLED_MODEL,
        help="the bundled model's name, a local Hugging Face model directory, or a Hub id "
        "(downloaded) (default: %(default)s)",
    )
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    prep.set_defaults(handler=_cmd_prepare)

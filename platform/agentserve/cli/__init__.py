"""`agentserve` command line: one module per command; each parses, validates, delegates.

up.py, status.py, chat.py, traces.py, generate.py, train_drafter.py, model.py and spec.py
each register their subcommand with `add_parser`; `agentserve bench ...` is registered by
agentserve.bench.command. Output goes through console.Console (human or plain agent-mode
output); signals.StopSignals is shared by `up` and `traces`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from agentserve import __version__
from agentserve.cli.traces import PhoenixNotInstalledError
from agentserve.model_sources import ModelNotFoundError
from dflash.train.prompts import PromptSourceMissingError

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]

# What a user can cause (a bad spec or flag, a missing file, model, package or program):
# a one-line message and exit 2. Anything else, a KeyError or IndexError from a bug
# included, propagates with its traceback. SpecError and DrafterMissingError are
# ValueErrors; ModelNotInSpecError (a `--model` the spec lacks) is a SpecError.
USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    FileNotFoundError,
    ModelNotFoundError,
    PhoenixNotInstalledError,
    PromptSourceMissingError,
)


def build_parser() -> argparse.ArgumentParser:
    from agentserve.bench import command as bench
    from agentserve.cli import chat, generate, model, spec, status, traces, train_drafter, up

    parser = argparse.ArgumentParser(
        prog="agentserve",
        description="Serve LLM agents fast: DFlash speculative decoding on vLLM behind Ray Serve, "
        "with per-tenant SLA autoscaling and multi-agent tracing. Runs embedded on CPU with a "
        "bundled model, or on Kubernetes GPU clusters (helm/agentserve).",
    )
    parser.add_argument("--version", action="version", version=f"agentserve {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for command in (up, status, chat, traces, generate, train_drafter, bench, model, spec):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        return handler(args)
    except USER_ERRORS as err:
        print(f"agentserve: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

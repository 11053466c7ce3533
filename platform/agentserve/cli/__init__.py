"""`agentserve` command line: one module per command; each parses, validates, delegates.

up.py, status.py, chat.py, traces.py, generate.py, train_drafter.py, model.py and spec.py
each register their subcommand with `add_parser`. Commands from other packages are plugins:
an `agentserve.commands` entry point names a `register(subparsers)` function; that is how
`agentserve bench ...` comes from agentserve_bench (pyproject.toml) without the runtime
importing the benchmarks. Output goes through console.Console (human or plain agent-mode
output); signals.StopSignals is shared by `up` and `traces`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from importlib.util import find_spec

from agentserve import __version__
from agentserve.cli.traces import PhoenixNotInstalledError
from agentserve.sources.models import ModelNotFoundError
from dflash.train.prompts import PromptSourceMissingError

__all__ = ["COMMANDS_GROUP", "build_parser", "main", "plugin_commands"]

Handler = Callable[[argparse.Namespace], int]
Register = Callable[[argparse._SubParsersAction], None]

COMMANDS_GROUP = "agentserve.commands"
# Plugins this repository ships, by entry-point value: found by name when the installed
# metadata predates them (a source checkout on PYTHONPATH, an editable install not rerun).
SOURCE_PLUGINS = {"bench": "agentserve_bench.command:register"}
PLUGIN_HINTS = {
    "bench": "the benchmarks are in the agentserve_bench package, which ships with "
    "agentserve's repository: install from a checkout (./install.sh, or pip install -e .)",
}

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


def plugin_commands(
    discovered: Sequence[tuple[str, str]] | None = None,
) -> dict[str, Register | str]:
    """name -> register function of each plugin command, or the message to print when it
    cannot be loaded. `discovered` is (name, "module:function") pairs; default: the
    `agentserve.commands` entry points, then SOURCE_PLUGINS for names they lack."""
    if discovered is None:
        discovered = [(ep.name, ep.value) for ep in entry_points(group=COMMANDS_GROUP)]
    values = dict(SOURCE_PLUGINS) | dict(discovered)
    commands: dict[str, Register | str] = {}
    for name, value in values.items():
        module, _, function = value.partition(":")
        hint = PLUGIN_HINTS.get(name, f"install the package that provides {module}")
        if find_spec(module.split(".")[0]) is None:
            commands[name] = f"`agentserve {name}` is not installed: {hint}"
            continue
        try:
            commands[name] = getattr(importlib.import_module(module), function)
        except ImportError as err:  # a plugin's missing dependency must not break the CLI
            commands[name] = f"`agentserve {name}` cannot load ({err}): {hint}"
    return commands


def _unavailable(sub: argparse._SubParsersAction, name: str, message: str) -> None:
    """A stand-in subcommand that says how to get the missing plugin (exit 2)."""

    def handler(_args: argparse.Namespace) -> int:
        print(f"agentserve: {message}", file=sys.stderr)
        return 2

    parser = sub.add_parser(name, help=f"(not available: see `agentserve {name}`)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    from agentserve.cli import chat, generate, model, spec, status, traces, train_drafter, up

    parser = argparse.ArgumentParser(
        prog="agentserve",
        description="Serve LLM agents fast: DFlash speculative decoding on vLLM behind Ray Serve, "
        "with per-tenant SLA autoscaling and multi-agent tracing. Runs embedded on CPU with a "
        "bundled model, or on Kubernetes GPU clusters (helm/agentserve).",
    )
    parser.add_argument("--version", action="version", version=f"agentserve {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for command in (up, status, chat, traces, generate, train_drafter):
        command.add_parser(sub)
    for name, plugin in plugin_commands().items():
        if isinstance(plugin, str):
            _unavailable(sub, name, plugin)
            continue
        names, choices = dict(sub._name_parser_map), list(sub._choices_actions)
        try:
            plugin(sub)
        except Exception as err:  # a broken plugin must not take every command down
            # undo what it registered before it failed, then stand in for it
            sub._name_parser_map.clear()
            sub._name_parser_map.update(names)
            sub._choices_actions[:] = choices
            hint = PLUGIN_HINTS.get(name, "reinstall the package that provides it")
            _unavailable(sub, name, f"`agentserve {name}` failed to load ({err!r}): {hint}")
    for command in (model, spec):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        group = getattr(args, "group_parser", None)
        if group is None:  # `agentserve` alone: what it can do
            parser.print_help()
            return 0
        group.print_help(sys.stderr)  # `agentserve model` without its action: a usage error
        return 2
    try:
        return handler(args)
    except USER_ERRORS as err:
        print(f"agentserve: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

"""`agentserve` command line: one subcommand per job; each parses, validates, delegates.

Serving commands live in cli_up.py (up), cli_status.py (status) and cli_chat.py (chat);
their output goes through console.Console (human or plain agent-mode output).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from agentserve import __version__

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


def _cmd_generate(args: argparse.Namespace) -> int:
    from agentserve.reference import run_reference

    return run_reference(args)


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from agentserve.models import resolve_model

    print(resolve_model(args.source, progress=not args.quiet))
    return 0


def _cmd_spec(args: argparse.Namespace) -> int:
    from agentserve.spec import DeploymentSpec, load_spec, spec_json_schema, to_yaml

    if args.action == "schema":
        print(json.dumps(spec_json_schema(), indent=2))
        return 0
    spec = load_spec(args.file) if args.file else DeploymentSpec()
    if args.action == "speculation-schedule":
        from agentserve.autoscale.model import LatencyModel
        from agentserve.autoscale.spec_schedule import with_speculation_schedule

        latency = LatencyModel.load(args.latency_model) if args.latency_model else None
        print(to_yaml(with_speculation_schedule(spec, latency, args.model)), end="")
        return 0
    if args.action == "validate":
        where = args.file or "(default spec)"
        print(f"{where}: ok ({len(spec.models)} model(s), {len(spec.tenants)} tenant(s))")
    else:
        print(to_yaml(spec), end="")
    return 0


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with the DFlash reference loop and report acceptance (tau)",
        description="Run prompts through the readable DFlash reference loop (dflash/generate.py) "
        "on CPU or GPU and print the text plus tokens/s, steps and acceptance length tau. "
        "The serving path is vLLM (`agentserve up`); this is for checking and research.",
    )
    p.add_argument(
        "prompts", nargs="*", help="user messages (chat template applied); default: two samples"
    )
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
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
    p.set_defaults(handler=_cmd_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentserve",
        description="Serve LLM agents fast: DFlash speculative decoding on vLLM behind Ray Serve, "
        "with per-tenant SLA autoscaling and multi-agent tracing. Runs embedded on CPU with a "
        "bundled model, or on Kubernetes GPU clusters (helm/agentserve).",
    )
    parser.add_argument("--version", action="version", version=f"agentserve {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    from agentserve import cli_chat, cli_status, cli_traces, cli_up, train_drafter

    cli_up.add_parser(sub)
    cli_status.add_parser(sub)
    cli_chat.add_parser(sub)
    cli_traces.add_parser(sub)
    _add_generate(sub)
    from agentserve.bench import command as bench

    train_drafter.add_parser(sub)
    bench.add_parser(sub)

    model = sub.add_parser(
        "model", help="prepare models (convert the bundled GGUF once, check local dirs)"
    )
    model_sub = model.add_subparsers(title="actions", metavar="ACTION")
    prep = model_sub.add_parser("prepare", help="convert/cache the model and print its directory")
    prep.add_argument(
        "source",
        nargs="?",
        default="smollm2-135m-instruct",
        help="bundled model name or local HF dir",
    )
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    prep.set_defaults(handler=_cmd_model_prepare)

    spec = sub.add_parser("spec", help="show, validate or export the schema of a DeploymentSpec")
    spec.add_argument(
        "action",
        choices=["show", "validate", "schema", "speculation-schedule"],
        help="show: print YAML; validate: check a file; schema: JSON schema; "
        "speculation-schedule: print the spec with each drafter's "
        "num_speculative_tokens_per_batch_size chosen by the latency model",
    )
    spec.add_argument(
        "file", nargs="?", help="spec YAML/JSON (default: the embedded CPU deployment)"
    )
    spec.add_argument(
        "--model", default=None, help="speculation-schedule: only this model (default: all)"
    )
    spec.add_argument(
        "--latency-model",
        default=None,
        help="speculation-schedule: LatencyModel JSON (default: fitted on the bundled CPU model)",
    )
    spec.set_defaults(handler=_cmd_spec)
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
    except (ValueError, FileNotFoundError, LookupError) as err:
        print(f"agentserve: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

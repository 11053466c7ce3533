"""`agentserve spec show | validate | schema | speculation-schedule`: a DeploymentSpec as
YAML, checked, as JSON schema, or with each drafter's batch-size schedule filled in."""

from __future__ import annotations

import argparse
import json

from agentserve.autoscale.model import LatencyModel
from agentserve.spec import DeploymentSpec, load_spec, spec_json_schema, to_yaml
from agentserve.speculation.schedule import with_speculation_schedule

__all__ = ["add_parser"]


def _cmd_spec(args: argparse.Namespace) -> int:
    if args.action == "schema":
        print(json.dumps(spec_json_schema(), indent=2))
        return 0
    spec = load_spec(args.file) if args.file else DeploymentSpec()
    if args.action == "speculation-schedule":
        latency = LatencyModel.load(args.latency_model) if args.latency_model else None
        print(to_yaml(with_speculation_schedule(spec, latency, args.model)), end="")
        return 0
    if args.action == "validate":
        where = args.file or "(default spec)"
        print(f"{where}: ok ({len(spec.models)} model(s), {len(spec.tenants)} tenant(s))")
    else:
        print(to_yaml(spec), end="")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `spec` on the CLI's subparsers."""
    spec = sub.add_parser(
        "spec",
        help="show, validate or export the schema of a DeploymentSpec; fill its speculation "
        "schedules",
    )
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

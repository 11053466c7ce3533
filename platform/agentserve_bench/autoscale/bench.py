"""`agentserve bench autoscale`: the simulator comparison of autoscaling policies
(compare.py) written where the docs read it: docs/benchmarks/autoscale.json,
docs/benchmarks/autoscale.png and the generated section of docs/autoscaling.md."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentserve.autoscale.model import LatencyModel

from agentserve_bench.autoscale.compare import Scenario, plot, run_comparison
from agentserve_bench.autoscale.trace import TraceConfig, generate_trace
from agentserve_bench.report import default_docs, replace_section

__all__ = ["add_parser", "markdown_summary"]

_LABELS = {
    "sla_policy": "**SLA policy** (this; defaults, standby derived from the start)",
    "sla_policy_no_standby": "SLA policy, no standby (`standby_replicas: 0`)",
    "sla_policy_fifo": "SLA policy, priority off (FIFO)",
    "ttft_only": "TTFT-only (reactive, no floor, no TPOT)",
    "sla_policy_fixed_k": "SLA policy, fixed {k} drafted tokens (no schedule)",
    "sla_policy_no_spec": "SLA policy, no speculation",
    "sla_policy_no_burst": "SLA policy, no burst detector (standby derived)",
    "sla_policy_standby_routed": "SLA policy + {standby} standby set by hand (routed)",
    "sla_policy_standby_unrouted": "SLA policy + {standby} standby (unrouted: simulator only)",
    "sla_policy_standby_routed_no_burst": (
        "SLA policy, no burst detector + {standby} standby (routed)"
    ),
}


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "autoscale",
        help="SLA autoscaler vs Ray default vs TTFT-only on a seeded trace (simulator)",
        description="Replays a seeded multi-agent trace (two tenants, diurnal ramp, burst) "
        "through the discrete-event simulator under each policy; writes "
        "docs/benchmarks/autoscale.json, docs/benchmarks/autoscale.png and the measured "
        "section of docs/autoscaling.md.",
    )
    p.add_argument("--seed", type=int, default=None, help="trace seed (default: 7)")
    p.add_argument("--duration-s", type=float, default=None, help="trace length (default: 1800)")
    p.add_argument(
        "--latency-model", type=Path, default=None, help="LatencyModel JSON (default: built-in)"
    )
    p.add_argument(
        "--speculation",
        choices=["schedule", "fixed"],
        default=None,
        help="replicas draft by the per-batch schedule (default: what deployments fill) or "
        "the fixed num_speculative_tokens at every batch (drafter speculation_schedule: off)",
    )
    p.add_argument(
        "--docs",
        type=Path,
        default=default_docs(),
        help="where autoscaling.md and benchmarks/ live (default: %(default)s)",
    )
    p.set_defaults(handler=run)


def _label(name: str, scenario: dict[str, Any]) -> str:
    if name.startswith("ray_default_target_"):
        return f"Ray default, target_ongoing {name.rsplit('_', 1)[1]}"
    if name.startswith("fixed_"):
        return f"Fixed fleet of {name.split('_', 1)[1]}"
    return _LABELS.get(name, name).format(
        k=scenario.get("max_drafted"), standby=scenario.get("standby_replicas")
    )


def _drafting(name: str, scenario: dict[str, Any]) -> str:
    """How the row's replicas draft: the schedule, the fixed k, or not at all."""
    if name == "sla_policy_no_spec":
        return "none"
    if name == "sla_policy_fixed_k" or scenario.get("speculation") == "fixed":
        return f"fixed {scenario.get('max_drafted')}"
    return "by batch"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def markdown_summary(report: dict[str, Any]) -> str:
    """Table of per-tenant attainment (all requests, outside and inside the burst),
    requests shed, replica-seconds and scaling actions per policy, plus the
    equal-attainment savings."""
    tenants = list(report["slas"])
    columns = ["policy", "drafting", *tenants, *(f"{t} outside burst" for t in tenants)]
    columns += [f"{t} in burst" for t in tenants]
    columns += ["shed", "replica-seconds", "actions"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for name, r in report["policies"].items():
        cells = [_label(name, report["scenario"]), _drafting(name, report["scenario"])]
        cells += [_pct(r["tenants"][t]["attainment"]) for t in tenants]
        cells += [_pct(r["tenants"][t]["attainment_outside_burst"]) for t in tenants]
        cells += [_pct(r["tenants"][t].get("attainment_in_burst")) for t in tenants]
        cells.append(str(sum(r["tenants"][t].get("shed", 0) for t in tenants)))
        cells += [f"{r['replica_seconds']:,.0f}", str(r["scaling_actions"])]
        lines.append("| " + " | ".join(cells) + " |")
    for m in report["at_equal_attainment"]:
        name = m.get("policy", "sla_policy")
        who = "the SLA policy" if name == "sla_policy" else _label(name, report["scenario"])
        if m["ray_default"] is None:
            lines.append(
                f"\nAt equal {m['metric']} ({who}: {_pct(m['ours'])}): no Ray-default "
                "setting reaches it."
            )
            continue
        fewer = "fewer" if m["saving"] >= 0 else "more"
        target = m["ray_default"].rsplit("_", 1)[1]
        lines.append(
            f"\nAt equal {m['metric']} ({who}: {_pct(m['ours'])}): the cheapest Ray-default "
            f"setting that matches is target_ongoing {target} "
            f"({_pct(m['ray_default_attainment'])}); {who} uses "
            f"**{abs(100 * m['saving']):.0f}% {fewer} replica-seconds**."
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    cfg = TraceConfig()
    if args.seed is not None:
        cfg = replace(cfg, seed=args.seed)
    if args.duration_s is not None:
        cfg = replace(cfg, duration_s=args.duration_s, burst_start_s=args.duration_s * 7 / 12)
    model = LatencyModel.load(args.latency_model) if args.latency_model else LatencyModel()
    started = time.perf_counter()
    scenario = Scenario(trace=cfg, model=model, speculation=args.speculation or "schedule")
    report = run_comparison(scenario, generate_trace(cfg))
    docs = Path(args.docs)
    out, png = docs / "benchmarks" / "autoscale.json", docs / "benchmarks" / "autoscale.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(report, png)
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    public["command"] = "agentserve bench autoscale" + _flags(args)
    out.write_text(json.dumps(public, indent=2) + "\n", encoding="utf-8")
    summary = markdown_summary(public)
    body = (
        f"Command: `{public['command']}` ({time.perf_counter() - started:.0f} s). "
        f"Raw figures: `benchmarks/autoscale.json`; trace sha256 "
        f"`{public['trace']['sha256'][:12]}`.\n\n{summary}"
    )
    replace_section(docs / "autoscaling.md", "autoscale", body)
    print(summary)
    print(json.dumps({"written": [str(out), str(png), str(docs / "autoscaling.md")]}))
    return 0


def _flags(args: argparse.Namespace) -> str:
    flags = [("--seed", args.seed), ("--duration-s", args.duration_s)]
    flags.append(("--latency-model", args.latency_model))
    flags.append(("--speculation", args.speculation))
    return "".join(f" {name} {value}" for name, value in flags if value is not None)

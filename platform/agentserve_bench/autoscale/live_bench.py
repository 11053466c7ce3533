"""`agentserve bench autoscale-live`: the SLA policy on a live local Ray Serve (live.py),
priority off then on in the same run; prints a markdown table and writes the JSON
(default docs/benchmarks/autoscale_live.json)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentserve_bench.autoscale.live import PHASES, PRESETS, run_live
from agentserve_bench.report import default_docs

__all__ = ["add_parser", "markdown_summary", "timeline_text"]

DEFAULT_OUT = default_docs() / "benchmarks" / "autoscale_live.json"


def _sla(text: str) -> tuple[float, float]:
    ttft, tpot = (float(x) for x in text.split(","))
    return ttft, tpot


def _pair(sla: tuple[float, float]) -> str:
    return ",".join(f"{v:g}" for v in sla)


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "autoscale-live",
        help="SLA autoscaler and tenant priority on a live local Ray Serve (real engines)",
        description="Starts a local Ray (2 CPUs) and Serve, deploys one model that the SLA "
        "policy autoscales between 1 and 2 replicas (with --engine vllm: the bundled model, "
        "each replica's vLLM bound to one core), with two tenants: interactive (tight "
        "TTFT/TPOT objectives) and batch (sla_class batch, loose ones). A short seeded "
        "two-tenant trace with a 3x interactive burst (the simulator's generator, scaled "
        "down) is replayed as streamed HTTP chat requests twice, each time from a fresh "
        "1-replica deployment: priority off (arrival-order dispatch, first come first "
        "served in the engine), then on (deadline-order dispatch, batch past its deadline "
        "refused with 429, vLLM priority scheduling). Reports per phase and tenant SLA "
        "attainment (all, outside and in the burst), TTFT/TPOT p50/p95, the replica "
        "timeline and whether it went 1 -> 2 -> 1, the policy's decisions; prints a "
        "markdown table and writes the JSON (with every request, the command and the "
        "machine). vllm takes about 10-12 minutes; fake under two.",
    )
    p.add_argument("--engine", choices=sorted(PRESETS), default="vllm", help="default: %(default)s")
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="JSON report (default: %(default)s)",
    )
    p.add_argument("--duration-s", type=float, default=None, help="trace length (vllm: 210)")
    p.add_argument(
        "--rate-scale",
        type=float,
        default=None,
        help="multiplies both tenants' session rates (vllm: 1 = 20 interactive and 3 batch "
        "sessions a minute, interactive 3x in the burst)",
    )
    p.add_argument("--seed", type=int, default=None, help="trace seed (default: 7)")
    p.add_argument("--phases", default=None, help="comma list of off,on (default: off,on)")
    p.add_argument(
        "--interactive-sla",
        type=_sla,
        default=None,
        help=f"TTFT_MS,TPOT_MS p95 objectives (vllm: {_pair(PRESETS['vllm'].interactive_sla)})",
    )
    p.add_argument(
        "--batch-sla",
        type=_sla,
        default=None,
        help=f"TTFT_MS,TPOT_MS (vllm: {_pair(PRESETS['vllm'].batch_sla)})",
    )
    p.add_argument("--dtype", default=None, help="vLLM dtype (default: bfloat16)")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default: 8790)")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: print the summary of the report at --out and rewrite its scale-up "
        "rows in the startup.json beside it",
    )
    p.set_defaults(handler=run)


_OVERRIDES = {
    "duration_s": "--duration-s",
    "rate_scale": "--rate-scale",
    "seed": "--seed",
    "interactive_sla": "--interactive-sla",
    "batch_sla": "--batch-sla",
    "dtype": "--dtype",
    "port": "--port",
}


def config_from_args(args: argparse.Namespace) -> Any:
    """The engine's preset with every given option applied."""
    cfg = PRESETS[args.engine]
    given = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    if args.phases:
        given["phases"] = tuple(args.phases.split(","))
        unknown = set(given["phases"]) - set(PHASES)
        if unknown:
            raise ValueError(f"--phases: {sorted(unknown)} not in {sorted(PHASES)}")
    return replace(cfg, **given)


def command_line(args: argparse.Namespace) -> str:
    flags = [f"--engine {args.engine}"]
    for key, flag in _OVERRIDES.items():
        value = getattr(args, key)
        if value is not None:
            text = _pair(value) if isinstance(value, tuple) else value
            flags.append(f"{flag} {text}")
    if args.phases:
        flags.append(f"--phases {args.phases}")
    if Path(args.out) != DEFAULT_OUT:
        flags.append(f"--out {args.out}")
    return "agentserve bench autoscale-live " + " ".join(flags)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def timeline_text(points: list[dict[str, Any]]) -> str:
    """RUNNING replicas over time: "1 (0 s) -> 2 (41 s) -> 1 (150 s)"."""
    steps: list[str] = []
    last = None
    for p in points:
        if p["running"] != last:
            steps.append(f"{p['running']} ({p['t_s']:g} s)")
            last = p["running"]
    return " -> ".join(steps) or "-"


def markdown_summary(report: dict[str, Any]) -> str:
    columns = ["priority", "tenant", "requests", "attainment", "outside burst", "in burst"]
    columns += ["TTFT p50 / p95 ms", "TPOT p50 / p95 ms", "statuses"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for phase, r in report["phases"].items():
        for tenant, t in r["tenants"].items():
            statuses = ", ".join(f"{k}: {v}" for k, v in t["statuses"].items())
            cells = [phase, tenant, str(t["requests"]), _pct(t["attainment"])]
            cells += [_pct(t["attainment_outside_burst"]), _pct(t["attainment_in_burst"])]
            cells += [f"{_ms(t['ttft_p50_ms'])} / {_ms(t['ttft_p95_ms'])}"]
            cells += [f"{_ms(t['tpot_p50_ms'])} / {_ms(t['tpot_p95_ms'])}", statuses]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for phase, r in report["phases"].items():
        went = "yes" if r["scaled_1_2_1"] else "no"
        lines.append(
            f"- priority {phase}: replicas {timeline_text(r['timeline'])}; 1 -> 2 -> 1: "
            f"{went}; scale-up replica started in {r.get('scale_up_s')} s; "
            f"{r['replica_seconds']:,.0f} replica-seconds; replay {r['replay_s']:g} s"
        )
    helps = report.get("priority_helps_interactive")
    if helps is not None:
        att = report["interactive_attainment"]
        lines.append(
            f"- interactive attainment, priority on vs off: {_pct(att['on'])} vs "
            f"{_pct(att['off'])} ({'higher' if helps else 'not higher'} with priority)"
        )
    return "\n".join(lines) + "\n"


def _record_scale_ups(report: dict[str, Any], docs: Path) -> None:
    """The run's scale-up replicas as startup.json "scale_up" rows (live_scale_up), when
    the report goes to a docs tree (one with benchmarks.md); printed either way."""
    from datetime import date

    from agentserve.engine.cpu_info import read_cpu_info
    from agentserve.engine.cpu_settings import compile_on_cpu

    from agentserve_bench.autoscale.live_scale_up import record_scale_ups, scale_up_rows

    # the machine that ran it (reports from before it was recorded: this one)
    machine = report["machine"].get("cpu_info") or read_cpu_info().as_dict()
    cpu_class = machine["cpu_class"]
    common = {
        "engine": "vllm",
        "compile": "compiled" if compile_on_cpu(cpu_class=cpu_class) else "eager",
        "date": report["machine"].get("date", "")[:10] or date.today().isoformat(),
        "machine": machine,
        "command": report["command"],
    }
    rows = scale_up_rows(report, common)
    for r in rows:
        print(f"- scale-up ({r['live_phase']}): ready {r['ready_s']} s, first token "
              f"{r['first_token_s']} s after the {r['from']}; {r['phases']}")  # fmt: skip
    if rows and (docs / "benchmarks.md").is_file():
        print(f"written: {record_scale_ups(rows, cpu_class, docs)} (scale_up rows)")


def run(args: argparse.Namespace) -> int:
    if args.report_only:
        report = json.loads(Path(args.out).read_text(encoding="utf-8"))
        print(markdown_summary(report))
        if report["config"]["engine"] == "vllm":
            _record_scale_ups(report, Path(args.out).parent.parent)
        return 0
    cfg = config_from_args(args)
    report = run_live(cfg)
    report["command"] = command_line(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(markdown_summary(report))
    if cfg.engine == "vllm":
        _record_scale_ups(report, out.parent.parent)
    print(json.dumps({"written": str(out), "wall_s": report["wall_s"]}))
    return 0

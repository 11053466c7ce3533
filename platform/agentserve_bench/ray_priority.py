"""`agentserve bench ray-priority`: what Ray's worker niceness costs the served path, measured
on one running platform in interleaved rounds (agentserve/ray_env.py says why it matters).

The embedded platform starts once with Ray's defaults (AGENTSERVE_RAY_ENV=ray: its workers
at nice 15, the engine brought back to 0). Each round then runs the coding workload at
every concurrency twice: with the threads Ray started at nice 15 left there, and with them
at nice 0 (renice, live), in alternating order. Rounds alternate because this kind of
machine drifts by a third within minutes: only a paired comparison says anything. Lowering
niceness needs root or CAP_SYS_NICE. Writes docs/benchmarks/ray-priority.json (this kind
of CPU's rows replaced) and the "ray-priority" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from datetime import date
from pathlib import Path
from typing import Any

from agentserve_bench.report import measured_with, paired_rounds

__all__ = ["add_parser", "ray_threads", "run", "summarize"]

LEVELS = (15, 0)
_SERVE_PROCESSES = ("ray::ServeReplica", "ray::ProxyActor", "ray::ServeController")


def ray_threads(niceness: int = 15, proc: Path = Path("/proc")) -> list[int]:
    """Thread ids of Serve's processes (replicas, proxy, controller) running at `niceness`."""
    tids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
            if not command.startswith(_SERVE_PROCESSES):
                continue
            for task in (entry / "task").iterdir():
                if os.getpriority(os.PRIO_PROCESS, int(task.name)) == niceness:
                    tids.append(int(task.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # a process or thread that ended meanwhile
    return tids


def _renice(tids: list[int], niceness: int) -> None:
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except ProcessLookupError:
            continue


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency: medians per niceness and the paired ratios nice 0 / nice 15 of each
    round (pure)."""
    out = []
    for p in paired_rounds(rows, "niceness", LEVELS, ("decode_tokens_per_s", "ttft_ms_p50")):
        summary = {k: p[k] for k in ("kind", "concurrency", "rounds")}
        for i, n in enumerate(LEVELS):
            summary[f"nice{n}_decode_tokens_per_s"] = round(p["decode_tokens_per_s"][i], 2)
            summary[f"nice{n}_ttft_ms_p50"] = round(p["ttft_ms_p50"][i], 1)
        summary["decode_ratio_median"] = p["decode_tokens_per_s_ratio_median"]
        summary["ttft_ratio_median"] = p["ttft_ms_p50_ratio_median"]
        summary["ttft_lower_in_rounds"] = p["rounds"] - p["ttft_ms_p50_higher_in_rounds"]
        out.append(summary)
    return out


def section(records: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section (pure)."""
    lines = [
        "| CPU | c | rounds | decode tok/s nice 15 / 0 | ratio | TTFT p50 ms nice 15 / 0 "
        "| ratio | TTFT lower at 0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in (r for r in records if r.get("kind") == "summary"):
        lines.append(
            f"| {s['machine']['cpu_class']} | {s['concurrency']} | {s['rounds']} "
            f"| {s['nice15_decode_tokens_per_s']} / {s['nice0_decode_tokens_per_s']} "
            f"| {s['decode_ratio_median']}x | {s['nice15_ttft_ms_p50']} / {s['nice0_ttft_ms_p50']} "
            f"| {s['ttft_ratio_median']}x | {s['ttft_lower_in_rounds']} of {s['rounds']} |"
        )
    return (
        f"{measured_with(records)}: one platform (plain "
        "decoding, Ray's defaults), Serve's threads reniced live between rounds, medians over "
        "rounds, ratios paired within a round.\n\n" + "\n".join(lines) + "\n"
    )


def run(args: argparse.Namespace) -> int:
    from agentserve.engine.cpu_info import read_cpu_info
    from agentserve.ray_env import RAY_DEFAULTS

    from agentserve_bench.report import write_machine_rows
    from agentserve_bench.served_client import level_figures, run_workload, workload_messages
    from agentserve_bench.speculative_served import _agentserve, _engine_factory, bench_spec

    cpu = read_cpu_info()
    print(f"machine: {cpu.describe()}", flush=True)
    os.environ.update({"AGENTSERVE_RAY_ENV": "ray", **RAY_DEFAULTS})
    conversations = workload_messages("coding", args.num_prompts)
    spec = bench_spec("none", 0, args.port, max(args.concurrency), None)
    model = spec.models[0].name
    common = {"date": date.today().isoformat(), "machine": cpu.as_dict(), "engine": "vllm"}
    common["command"] = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows: list[dict[str, Any]] = []
    with _agentserve(spec, args.start_timeout_s, _engine_factory("vllm", "none")) as (base, _):
        tids = ray_threads(15)
        if not tids:
            raise SystemExit("no Serve thread at nice 15: Ray's worker niceness is not 15 here")
        try:
            _renice(tids[:1], 0)
            _renice(tids[:1], 15)
        except PermissionError:
            raise SystemExit("lowering niceness needs root or CAP_SYS_NICE") from None
        asyncio.run(run_workload(base, model, conversations[:2], 1, 32))  # warm-up
        for i in range(args.rounds):
            for niceness in LEVELS if i % 2 == 0 else LEVELS[::-1]:
                _renice(tids, niceness)
                for c in args.concurrency:
                    replies, wall = asyncio.run(
                        run_workload(base, model, conversations, c, args.max_tokens)
                    )
                    f = level_figures(replies, wall)
                    rows.append({"kind": "level", "round": i, "niceness": niceness,
                                 "concurrency": c, **f, **common})  # fmt: skip
                    print(f"  round {i} nice {niceness:2d} c={c}: {f['decode_tokens_per_s']} "
                          f"tok/s, TTFT p50 {f['ttft_ms_p50']} ms", flush=True)  # fmt: skip
    records = rows + [{**s, **common} for s in summarize(rows)]
    for s in records[len(rows) :]:
        print(f"  c={s['concurrency']}: decode {s['decode_ratio_median']}x, TTFT "
              f"{s['ttft_ratio_median']}x at nice 0 ({s['ttft_lower_in_rounds']} of "
              f"{s['rounds']} rounds lower)")  # fmt: skip
    write_machine_rows(args.docs, "ray-priority", records, cpu.cpu_class, section)
    return 0


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.arg_types import ints
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "ray-priority",
        help="served speed with Serve's processes at Ray's nice 15 vs nice 0, interleaved",
        description=__doc__.split("\n\n")[1] + " Run it with nothing else on the machine.",
    )
    p.add_argument("--rounds", type=int, default=5, help="(default: %(default)s)")
    p.add_argument("--concurrency", type=ints, default=[1, 4], help="comma list (default: 1,4)")
    p.add_argument("--num-prompts", type=int, default=6, help="coding conversations (default: 6)")
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument("--port", type=int, default=8722, help="(default: %(default)s)")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

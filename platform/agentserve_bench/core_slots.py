"""`agentserve bench core-slots`: several CPU replicas on one machine, each engine on a slot of
the cores (engine/core_slots.py) against every engine on every core, and against the one
replica a user gets by default, and vLLM's own server.

Each round starts, in rotating order: "one" (the embedded platform with one replica on
every core: `agentserve up` as shipped), "shared" (`--replicas` replicas whose engines each
bind every core: how several replicas ran before slots), "slots" (the same replicas, a slot
of cores each) and "vllm" (vLLM's own server with the replica's engine arguments, what a
user would run instead). Each serves the held-out coding workload at every concurrency;
figures per level: aggregate output tokens/s, decode tokens/s, TTFT p50.
Ratios are paired within a round (this kind of machine drifts by a third within minutes).
Writes docs/benchmarks/core-slots.json (this kind of CPU's rows replaced) and the
"core-slots" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

from agentserve_bench.report import measured_with, paired_rounds

__all__ = ["VARIANTS", "add_parser", "run", "summarize", "variant_spec"]

VARIANTS = ("one", "shared", "slots", "vllm")
KEYS = ("throughput_tokens_per_s", "decode_tokens_per_s", "ttft_ms_p50")


def variant_spec(base: Any, variant: str, replicas: int) -> tuple[Any, str]:
    """The spec a variant serves (one replica for "one", else `replicas`) and the value of
    AGENTSERVE_CPU_REPLICAS it starts with ("1": every engine binds every core) (pure)."""
    from agentserve.spec import spec_from_dict

    count = 1 if variant in ("one", "vllm") else replicas
    data = base.model_dump(mode="json", exclude_unset=True)
    data["models"] = [m.model_dump(mode="json", exclude_unset=True) for m in base.models]
    data["models"][0]["replicas"] = {"min_replicas": count, "max_replicas": count}
    engines = str(count) if variant == "slots" else "1"
    return spec_from_dict(data, source=f"(bench core-slots: {variant})"), engines


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency: medians per variant and the paired ratios of slots to each other
    variant (pure)."""
    out = []
    for other in ("one", "shared", "vllm"):
        pairs = [r for r in rows if r["variant"] in (other, "slots")]
        for p in paired_rounds(pairs, "variant", (other, "slots"), KEYS):
            summary = {"kind": "summary", "against": other, "concurrency": p["concurrency"]}
            summary["rounds"] = p["rounds"]
            for key in KEYS:
                summary[key] = [round(v, 1) for v in p[key]]
                summary[f"{key}_ratio"] = p[f"{key}_ratio_median"]
                summary[f"{key}_higher_in_rounds"] = p[f"{key}_higher_in_rounds"]
            out.append(summary)
    return out


def section(records: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section (pure)."""
    lines = [
        "| CPU | replicas | c | rounds | against | aggregate tok/s (it / slots) | ratio "
        "| higher in | TTFT p50 ms (it / slots) | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in (r for r in records if r.get("kind") == "summary"):
        tput, ttft = s["throughput_tokens_per_s"], s["ttft_ms_p50"]
        lines.append(
            f"| {s['machine']['cpu_class']} | {s['replicas']} | {s['concurrency']} "
            f"| {s['rounds']} | {s['against']} | {tput[0]} / {tput[1]} "
            f"| {s['throughput_tokens_per_s_ratio']}x "
            f"| {s['throughput_tokens_per_s_higher_in_rounds']} of {s['rounds']} "
            f"| {ttft[0]} / {ttft[1]} | {s['ttft_ms_p50_ratio']}x |"
        )
    return (
        f"{measured_with(records)}: the held-out coding workload, medians over rounds, "
        'ratios slots / the other variant paired within a round ("one": one replica on '
        'every core; "shared": the same replicas, every engine on every core; "vllm": '
        "vLLM's own server).\n\n" + "\n".join(lines) + "\n"
    )


def run(args: argparse.Namespace) -> int:
    from agentserve.engine.core_slots import REPLICAS_VARIABLE
    from agentserve.engine.cpu_info import read_cpu_info

    from agentserve_bench.report import write_machine_rows
    from agentserve_bench.served_client import level_figures, run_workload, workload_messages
    from agentserve_bench.speculative_served import (
        _agentserve,
        _engine_factory,
        _vllm_serve,
        bench_spec,
    )

    cpu = read_cpu_info()
    print(f"machine: {cpu.describe()}", flush=True)
    method, _, k = args.method.partition(":")
    base = bench_spec(method, int(k or 0), args.port, max(args.concurrency), None)
    conversations = workload_messages("coding", args.num_prompts, half=args.half)
    model = base.models[0].name
    common = {"date": date.today().isoformat(), "machine": cpu.as_dict(), "method": args.method}
    common["command"] = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    common["replicas"] = args.replicas
    rows: list[dict[str, Any]] = []
    logs = Path(tempfile.mkdtemp(prefix="bench-core-slots-"))
    for i in range(args.rounds):
        n = len(args.variants)
        for variant in args.variants[i % n :] + args.variants[: i % n]:
            spec, engines = variant_spec(base, variant, args.replicas)
            os.environ[REPLICAS_VARIABLE] = engines
            if variant == "vllm":
                serving = _vllm_serve(spec, args.start_timeout_s, logs)
            else:
                serving = _agentserve(spec, args.start_timeout_s, _engine_factory("vllm", method))
            with serving as (url, _):
                asyncio.run(run_workload(url, model, conversations[:2], 2, 32))  # warm-up
                for c in args.concurrency:
                    replies, wall = asyncio.run(
                        run_workload(url, model, conversations, c, args.max_tokens)
                    )
                    f = level_figures(replies, wall)
                    rows.append({"kind": "level", "round": i, "variant": variant,
                                 "concurrency": c, **f, **common})  # fmt: skip
                    tput, ttft = f["throughput_tokens_per_s"], f["ttft_ms_p50"]
                    print(f"  round {i} {variant:6s} c={c}: {tput} tok/s aggregate, "
                          f"TTFT p50 {ttft} ms", flush=True)  # fmt: skip
    os.environ.pop(REPLICAS_VARIABLE, None)
    records = rows + [{**s, **common} for s in summarize(rows)]
    for s in records[len(rows) :]:
        tput, ttft = s["throughput_tokens_per_s_ratio"], s["ttft_ms_p50_ratio"]
        print(f"  c={s['concurrency']} slots vs {s['against']}: aggregate {tput}x, "
              f"TTFT p50 {ttft}x")  # fmt: skip
    write_machine_rows(args.docs, "core-slots", records, cpu.cpu_class, section)
    return 0


def _variants(text: str) -> tuple[str, ...]:
    chosen = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {unknown}: {', '.join(VARIANTS)}")
    return chosen if "slots" in chosen else ("slots", *chosen)


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.arg_types import ints
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "core-slots",
        help="several CPU replicas on one machine: a slot of cores each vs every engine on "
        "every core vs one replica, interleaved",
        description=__doc__.split("\n\n")[1] + " Run it with nothing else on the machine.",
    )
    p.add_argument("--replicas", type=int, default=2, help="(default: %(default)s)")
    p.add_argument(
        "--variants",
        type=_variants,
        default=VARIANTS,
        help=f"comma list of {', '.join(VARIANTS)} (default: all; slots always runs)",
    )
    p.add_argument("--rounds", type=int, default=2, help="(default: %(default)s)")
    p.add_argument(
        "--concurrency", type=ints, default=[1, 4, 16], help="comma list (default: 1,4,16)"
    )
    p.add_argument(
        "--method", default="none", help="METHOD[:k] every variant serves (default: none)"
    )
    p.add_argument("--num-prompts", type=int, default=16, help="coding conversations (16)")
    p.add_argument("--half", default="report", help="workload half (default: report)")
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument("--port", type=int, default=8723, help="(default: %(default)s)")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

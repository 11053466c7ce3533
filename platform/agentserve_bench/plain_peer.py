"""`agentserve bench plain-peer`: plain agentserve against vLLM's own server (issue 27's
0.95x target), in paired rounds instead of one pass per server.

On a 2-core machine single measurements of the same server move by 10% and more between
minutes (docs/benchmarks.md, "Reading the served figures"): one pass of each server, as
`bench speculative-served` makes, gave agentserve/vLLM at c=4 anywhere between 0.76x and
0.99x over a day. Here each round starts both servers in turn (a fresh `agentserve up` app,
then a fresh `vllm serve` with the same engine arguments and environment, or the reverse:
the order alternates), sends the same held-out coding conversations at each concurrency,
and pairs the two servers' figures within the round; the table reports the medians of the
paired ratios and in how many rounds agentserve was the faster. Writes
docs/benchmarks/plain-peer.json (this kind of CPU's rows replaced) and the "plain-peer"
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import date
from pathlib import Path
from typing import Any

from agentserve_bench.report import measured_with, paired_rounds

__all__ = ["ARMS", "KEYS", "add_parser", "run", "section", "summarize"]

ARMS = ("vllm_serve", "agentserve")  # ratios are agentserve / vllm_serve
KEYS = ("decode_tokens_per_s", "throughput_tokens_per_s", "ttft_ms_p50")


def round_order(i: int) -> tuple[str, str]:
    """The servers of round i in the order they run: alternating (pure)."""
    return ARMS if i % 2 == 0 else ARMS[::-1]


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency: medians per server and of the per-round ratios agentserve / vLLM (pure)."""
    out = []
    for p in paired_rounds(rows, "server", ARMS, KEYS):
        s: dict[str, Any] = {"kind": "summary", "concurrency": p["concurrency"],
                             "rounds": p["rounds"]}  # fmt: skip
        for key in KEYS:
            s[key] = [round(x, 2) for x in p[key]]
            s[f"{key}_ratio_median"] = p[f"{key}_ratio_median"]
            s[f"{key}_higher_in_rounds"] = p[f"{key}_higher_in_rounds"]
        out.append(s)
    return out


def section(records: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section (pure)."""
    lines = [
        "| CPU | c | rounds | decode tok/s vLLM / agentserve | ratio (agentserve higher in) "
        "| throughput tok/s vLLM / agentserve | ratio | TTFT p50 ms vLLM / agentserve | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in (r for r in records if r.get("kind") == "summary"):
        d, t, f = (s[k] for k in KEYS)
        lines.append(
            f"| {s['machine']['cpu_class']} | {s['concurrency']} | {s['rounds']} "
            f"| {d[0]} / {d[1]} | {s['decode_tokens_per_s_ratio_median']}x "
            f"({s['decode_tokens_per_s_higher_in_rounds']} of {s['rounds']}) "
            f"| {t[0]} / {t[1]} | {s['throughput_tokens_per_s_ratio_median']}x "
            f"| {f[0]} / {f[1]} | {s['ttft_ms_p50_ratio_median']}x |"
        )
    return (
        f"{measured_with(records)}: plain decoding, held-out coding conversations, a fresh "
        "`agentserve up` app and a fresh `vllm serve` (same engine arguments and environment) "
        "per round in alternating order; medians over rounds, ratios agentserve / vLLM paired "
        "within a round.\n\n" + "\n".join(lines) + "\n"
    )


def run(args: argparse.Namespace) -> int:
    from agentserve.engine.cpu_info import read_cpu_info

    from agentserve_bench.overhead_phases import free_port
    from agentserve_bench.report import write_machine_rows
    from agentserve_bench.served_client import workload_messages
    from agentserve_bench.settings_bundles import default_settings
    from agentserve_bench.speculative_served import _measure, bench_spec

    cpu = read_cpu_info()
    print(f"machine: {cpu.describe()}", flush=True)
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    conversations = {("coding", "both"): workload_messages("coding", args.num_prompts)}
    spec = bench_spec("none", 0, free_port(), 1, None)
    settings = default_settings(cpu.cpu_class)
    measure = argparse.Namespace(engine="vllm", start_timeout_s=args.start_timeout_s,
                                 max_tokens=args.max_tokens, concurrency=args.concurrency,
                                 metrics_settle_s=0.0, temperatures=[0.0])  # fmt: skip
    common = {"date": date.today().isoformat(), "machine": cpu.as_dict(), "engine": "vllm"}
    common["command"] = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows: list[dict[str, Any]] = []
    for i in range(args.rounds):
        for server in round_order(i):
            records = _measure(server, "none", 0, spec, measure, conversations,
                               cpu.as_dict(), settings, logs)  # fmt: skip
            for r in records:
                rows.append({"kind": "level", "round": i, "server": server,
                             "concurrency": r["concurrency"], "settings": settings,
                             **{k: r[k] for k in KEYS}, **common})  # fmt: skip
    summaries = [{**s, **common} for s in summarize(rows)]
    for s in summaries:
        print(
            f"  c={s['concurrency']}: decode {s['decode_tokens_per_s_ratio_median']}x "
            f"(agentserve higher in {s['decode_tokens_per_s_higher_in_rounds']} of "
            f"{s['rounds']}), throughput {s['throughput_tokens_per_s_ratio_median']}x",
            flush=True,
        )
    write_machine_rows(args.docs, "plain-peer", rows + summaries, cpu.cpu_class, section)
    return 0


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.arg_types import ints
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "plain-peer",
        help="plain agentserve vs vLLM's own server, in paired rounds (alternating order)",
        description=__doc__.split("\n\n")[1] + " Run it with nothing else on the machine.",
    )
    p.add_argument("--rounds", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=12, help="coding conversations (default: 12)")
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument("--concurrency", type=ints, default=[1, 4], help="comma list (default: 1,4)")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument(
        "--logs", default="/tmp/agentserve-bench-plain-peer", help="(default: %(default)s)"
    )
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

"""`agentserve bench stream-interval`: what the stream interval's cap (serve/coalesce.py), or
with --tokens the engine's stream interval in tokens, costs or buys through the server,
measured on one running platform in interleaved rounds.

The embedded platform starts once with the bundled model served twice, as two models that
differ only in `stream_interval_max_ms` (or `stream_interval_tokens`; one replica each; the
model not being measured is idle). Each round runs the coding workload at every concurrency
against each, in alternating order, because this kind of machine drifts by a third within
minutes: only a paired comparison says anything. Writes docs/benchmarks/stream-interval.json
(stream-tokens.json with --tokens; this kind of CPU's rows replaced) and the section of the
same name in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from datetime import date
from pathlib import Path
from typing import Any

from agentserve_bench.report import measured_with, paired_rounds

__all__ = ["add_parser", "run", "section", "summarize", "two_model_spec"]

KEYS = ("decode_tokens_per_s", "throughput_tokens_per_s", "ttft_ms_p50")
CAPS, TOKENS = "stream_interval_max_ms", "stream_interval_tokens"
# the spec field compared -> (model name tag, level row key, summary key, results stem)
ARMS = {
    CAPS: ("cap", "cap_ms", "caps_ms", "stream-interval"),
    TOKENS: ("tokens", "tokens", "stream_tokens", "stream-tokens"),
}


def two_model_spec(
    base: Any, values: tuple[float, float], field: str = CAPS
) -> tuple[Any, list[str]]:
    """`base` (one model) with that model twice, named `<name>-cap<ms>` (`-tokens<n>`), one
    replica each, differing only in `field`; (spec, model names in `values` order)."""
    from agentserve.spec import spec_from_dict

    data = base.model_dump(mode="json", exclude_unset=True)
    model = base.models[0].model_dump(mode="json", exclude_unset=True)
    names = [f"{base.models[0].name}-{ARMS[field][0]}{v:g}" for v in values]
    data["models"] = [
        {**model, "name": name, field: int(v) if field == TOKENS else v,
         "replicas": {**model.get("replicas", {}), "min_replicas": 1, "max_replicas": 1}}
        for name, v in zip(names, values, strict=True)
    ]  # fmt: skip
    return spec_from_dict(data, source="(bench stream-interval)"), names


def summarize(
    rows: list[dict[str, Any]], values: tuple[float, float], field: str = CAPS
) -> list[dict[str, Any]]:
    """Per concurrency: medians per value of `field` and the paired ratios (second / first)
    of each round (pure)."""
    _, row_key, summary_key, _ = ARMS[field]
    out = paired_rounds(rows, row_key, values, KEYS)
    for s in out:
        s[summary_key] = list(values)
        for key in KEYS:
            s[key] = [round(x, 2) for x in s[key]]
    return out


def _table(records: list[dict[str, Any]], field: str) -> list[str]:
    summary_key = ARMS[field][2]
    lines = [
        f"| CPU | c | {'caps ms' if field == CAPS else 'tokens'} | rounds | decode tok/s "
        "| ratio (higher in) | throughput tok/s | ratio (higher in) | TTFT p50 ms | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in (r for r in records if r.get("kind") == "summary"):
        d, t, f = s["decode_tokens_per_s"], s["throughput_tokens_per_s"], s["ttft_ms_p50"]
        arms = s[summary_key]
        lines.append(
            f"| {s['machine']['cpu_class']} | {s['concurrency']} "
            f"| {arms[0]:g} / {arms[1]:g} | {s['rounds']} "
            f"| {d[0]} / {d[1]} | {s['decode_tokens_per_s_ratio_median']}x "
            f"({s['decode_tokens_per_s_higher_in_rounds']}) "
            f"| {t[0]} / {t[1]} | {s['throughput_tokens_per_s_ratio_median']}x "
            f"({s['throughput_tokens_per_s_higher_in_rounds']}) "
            f"| {f[0]} / {f[1]} | {s['ttft_ms_p50_ratio_median']}x |"
        )
    return lines


def tokens_section(records: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section of the --tokens comparison (pure)."""
    return (
        f"{measured_with(records)}: one platform serving the bundled model twice (plain "
        "decoding, the default settings), the two differing only in `stream_interval_tokens` "
        "(vLLM's stream_interval: the engine hands the replica a stream's output every that "
        "many tokens); medians over rounds; ratios (second / first) paired within a round, "
        "with the rounds where the second was higher. It acts at every concurrency, so no "
        "row is a control: run it twice with the values swapped to rule out the replicas' "
        "own difference.\n\n" + "\n".join(_table(records, TOKENS)) + "\n"
    )


def section(records: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section (pure)."""
    lines = _table(records, CAPS)
    return (
        f"{measured_with(records)}: one platform serving "
        "the bundled model twice (plain decoding, the default settings), the two differing "
        "only in `stream_interval_max_ms`; medians over rounds; ratios (second cap / first) "
        "paired within a round, with the rounds where the second was higher.\n\n"
        + "\n".join(lines)
        + "\n"
        + _net_of_control(records)
    )


def _net_of_control(records: list[dict[str, Any]]) -> str:
    """The cap acts only with two or more streams on a replica, so at c=1 the two models
    serve alike but for what differs between their replicas (process, placement): the c=1
    ratio is the control, and each higher concurrency's ratio over it is the cap's effect."""
    out = []
    for cpu_class in sorted({r["machine"]["cpu_class"] for r in records if "machine" in r}):
        at = {r["concurrency"]: r for r in records
              if r.get("kind") == "summary" and r["machine"]["cpu_class"] == cpu_class}  # fmt: skip
        if 1 not in at:
            continue
        for c in sorted(x for x in at if x > 1):
            net = {
                key: at[c][f"{key}_ratio_median"] / at[1][f"{key}_ratio_median"]
                for key in ("decode_tokens_per_s", "throughput_tokens_per_s")
            }
            out.append(
                f"- `{cpu_class}` c={c}: decode {net['decode_tokens_per_s']:.3f}x, throughput "
                f"{net['throughput_tokens_per_s']:.3f}x (c={c} ratio / c=1 ratio)"
            )
    if not out:
        return ""
    return (
        "\nNet of the control (at c=1 the cap does not act, so the c=1 ratio is what differs "
        "between the two models' replicas):\n\n" + "\n".join(out) + "\n"
    )


def run(args: argparse.Namespace) -> int:
    from agentserve.engine.cpu_info import read_cpu_info

    from agentserve_bench.report import write_machine_rows
    from agentserve_bench.served_client import level_figures, run_workload, workload_messages
    from agentserve_bench.speculative_served import _agentserve, _engine_factory, bench_spec

    cpu = read_cpu_info()
    print(f"machine: {cpu.describe()}", flush=True)
    field = TOKENS if args.tokens else CAPS
    values = tuple(args.tokens or args.caps)
    _, row_key, _, stem = ARMS[field]
    conversations = workload_messages("coding", args.num_prompts)
    base = bench_spec("none", 0, args.port, max(args.concurrency), None)
    spec, names = two_model_spec(base, (values[0], values[1]), field)
    common = {"date": date.today().isoformat(), "machine": cpu.as_dict(), "engine": "vllm"}
    common["command"] = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows: list[dict[str, Any]] = []
    with _agentserve(spec, args.start_timeout_s, _engine_factory("vllm", "none")) as (url, _):
        for name in names:  # warm-up
            asyncio.run(run_workload(url, name, conversations[:2], 1, 32))
        for i in range(args.rounds):
            order = list(zip(values, names, strict=True))
            for value, name in order if i % 2 == 0 else order[::-1]:
                for c in args.concurrency:
                    repeat = conversations * max(1, c // 2)  # every stream busy most of the time
                    replies, wall = asyncio.run(run_workload(url, name, repeat, c, args.max_tokens))
                    f = level_figures(replies, wall)
                    rows.append({"kind": "level", "round": i, row_key: value, "concurrency": c,
                                 **f, **common})  # fmt: skip
                    print(f"  round {i} {name} c={c}: {f['decode_tokens_per_s']} tok/s, "
                          f"{f['throughput_tokens_per_s']} tok/s total, TTFT p50 "
                          f"{f['ttft_ms_p50']} ms", flush=True)  # fmt: skip
    records = rows + [{**s, **common} for s in summarize(rows, values, field)]
    for s in records[len(rows) :]:
        print(f"  c={s['concurrency']}: decode {s['decode_tokens_per_s_ratio_median']}x, "
              f"throughput {s['throughput_tokens_per_s_ratio_median']}x, TTFT "
              f"{s['ttft_ms_p50_ratio_median']}x ({names[1]} vs {names[0]})")  # fmt: skip
    render = tokens_section if field == TOKENS else section
    write_machine_rows(args.docs, stem, records, cpu.cpu_class, render)
    return 0


def _caps(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if len(values) != 2 or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("two caps in ms, e.g. 100,400")
    return values


def _tokens(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if len(values) != 2 or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("two token counts >= 1, e.g. 1,8")
    return values


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.arg_types import ints
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "stream-interval",
        help="served speed with two stream_interval_max_ms caps (or --tokens: two engine "
        "stream intervals), interleaved on one platform",
        description=__doc__.split("\n\n")[1] + " Run it with nothing else on the machine.",
    )
    p.add_argument("--caps", type=_caps, default=[100.0, 400.0],
                   help="the two caps in ms, baseline first (default: 100,400)")  # fmt: skip
    tokens_help = (
        "compare two stream_interval_tokens instead (the engine's stream "
        "interval), baseline first, e.g. 1,8 (writes stream-tokens.json)"
    )
    p.add_argument("--tokens", type=_tokens, default=None, help=tokens_help)
    p.add_argument("--rounds", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--concurrency", type=ints, default=[1, 4], help="comma list (default: 1,4)")
    p.add_argument("--num-prompts", type=int, default=6, help="coding conversations (default: 6)")
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument("--port", type=int, default=8723, help="(default: %(default)s)")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

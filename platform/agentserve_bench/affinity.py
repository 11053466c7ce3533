"""`agentserve bench affinity`: session and prefix affinity (models[].routing.affinity)
against Ray Serve's default routing, on multi-turn tool-calling agent conversations.

The embedded platform starts once with the bundled model served twice, as `<name>-affinity`
and `<name>-spread`, `--replicas` (2) replicas each, differing only in routing.affinity
(the model not being measured is idle). Each round runs, against each model in alternating
order: `--conversations` (8) concurrent agent conversations of `--turns` (6) turns, each
turn's reply sent back with a tool call and its result (an excerpt of a held-out
package's source), as an agent loop resends its growing context every turn. `--openings`
says how the conversations begin: "shared" (the workload "agent": every conversation of a
round opens with the same system prompt, tools and task preamble, which both replicas cache
whatever the routing) and/or "distinct" ("agent-distinct": each conversation's first
message carries its own tag, so no two share a prompt block, as agents with their own
instructions or documents do, and only the replica that served a conversation holds its
prefix). Then the
single-turn coding workload at the same concurrency (affinity must not cost throughput
where nothing is shared). Figures per model and workload: prefix cache hit rate (the sum of
usage.prompt_tokens_details.cached_tokens over the sum of prompt tokens), TTFT p50 and p90,
aggregate output tokens/s. Writes docs/benchmarks/affinity.json (this kind of CPU's rows
replaced) and the section `affinity` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from agentserve_bench.report import measured_with

__all__ = [
    "add_parser",
    "agent_conversations",
    "arm_figures",
    "round_openings",
    "run",
    "section",
    "summarize",
    "tool_turn",
    "two_routing_spec",
]

ARMS = ("spread", "affinity")  # baseline first: ratios are affinity / spread
KEYS = ("prefix_hit_rate", "ttft_ms_p50", "ttft_ms_p90", "throughput_tokens_per_s")
SESSION_HEADER = "x-session-id"
AGENT_WORKLOADS = {"shared": "agent", "distinct": "agent-distinct"}  # --openings -> workload
TOOL_RESULT_CHARS = 600  # per tool result: 6 turns stay inside the bundled model's context
READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read part of a source file of the project.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "part": {"type": "integer"}},
            "required": ["path"],
        },
    },
}


def two_routing_spec(
    base: Any, replicas: int, max_imbalance: int | None = None
) -> tuple[Any, dict[str, str]]:
    """`base` (one model) with that model twice, `<name>-spread` (routing.affinity off)
    and `<name>-affinity` (on), `replicas` replicas each; `max_imbalance` sets
    routing.max_imbalance_requests (None: the spec's default); (spec, arm -> model name)."""
    from agentserve.spec import spec_from_dict

    data = base.model_dump(mode="json", exclude_unset=True)
    model = base.models[0].model_dump(mode="json", exclude_unset=True)
    names = {arm: f"{base.models[0].name}-{arm}" for arm in ARMS}
    fleet = {"min_replicas": replicas, "max_replicas": replicas}
    bound = {} if max_imbalance is None else {"max_imbalance_requests": max_imbalance}
    data["models"] = [
        {**model, "name": names[arm], "replicas": {**model.get("replicas", {}), **fleet},
         "routing": {**model.get("routing", {}), **bound, "affinity": arm == "affinity"}}
        for arm in ARMS
    ]  # fmt: skip
    return spec_from_dict(data, source="(bench affinity)"), names


def tool_turn(turn: int, reply: str, result: str) -> list[dict[str, Any]]:
    """The messages an agent loop appends after a turn (pure): the assistant's reply with a
    read_file call, and the tool's result."""
    call_id = f"call_{turn}"
    arguments = json.dumps({"path": "src.py", "part": turn})
    call = {"id": call_id, "type": "function",
            "function": {"name": "read_file", "arguments": arguments}}  # fmt: skip
    return [
        {"role": "assistant", "content": reply, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result[:TOOL_RESULT_CHARS]},
    ]


def agent_conversations(n: int, turns: int) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """`n` conversations: (opening messages of a held-out agent prompt, the tool results
    of its turns: held-out source excerpts), deterministic."""
    from agentserve_bench.served_client import workload_messages

    openings = workload_messages("agent", n)
    excerpts = [m[-1]["content"] for m in workload_messages("coding", n * (turns - 1))]
    return [
        (opening, excerpts[i * (turns - 1) : (i + 1) * (turns - 1)])
        for i, opening in enumerate(openings)
    ]


def round_openings(
    agents: list[tuple[list[dict[str, Any]], list[str]]], tag: str, distinct: bool
) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """The round's conversations (pure): each first message tagged `[tag]` (fresh every
    round and arm: nothing cached from the last), and with `distinct` also the
    conversation's index, so no two conversations share a leading prompt block."""
    out = []
    for i, (opening, results) in enumerate(agents):
        label = f"[{tag} #{i}] " if distinct else f"[{tag}] "
        first = {**opening[0], "content": label + opening[0]["content"]}
        out.append(([first, *opening[1:]], results))
    return out


async def _conversation(client, model, opening, results, max_tokens, session) -> list[Any]:
    """One agent conversation, turn after turn; the replies of its turns."""
    from agentserve_bench.served_client import stream_chat

    messages, replies = list(opening), []
    headers = {SESSION_HEADER: session} if session else None
    for turn in range(len(results) + 1):
        reply = await stream_chat(
            client, model, messages, max_tokens, headers=headers, extra={"tools": [READ_FILE_TOOL]}
        )
        replies.append(reply)
        if turn < len(results):
            messages += tool_turn(turn, reply.text, results[turn])
    return replies


async def run_agents(
    base_url: str,
    model: str,
    conversations: list[tuple[list[dict[str, Any]], list[str]]],
    max_tokens: int,
    sessions: bool,
    tag: str,
    timeout_s: float = 600.0,
) -> tuple[list[Any], float]:
    """Every conversation at once, each its turns in order; (all replies, wall seconds).
    `sessions`: each sends x-session-id `<tag>-<i>` (as agentserve.sdk does), else none
    (affinity then keys on the leading prompt)."""
    import httpx

    limits = httpx.Limits(max_connections=len(conversations) + 2)
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=httpx.Timeout(timeout_s), trust_env=False
    ) as client:
        start = time.perf_counter()
        runs = await asyncio.gather(
            *(
                _conversation(
                    client, model, opening, results, max_tokens, f"{tag}-{i}" if sessions else None
                )
                for i, (opening, results) in enumerate(conversations)
            )
        )
        wall = time.perf_counter() - start
    return [reply for replies in runs for reply in replies], wall


def arm_figures(replies: list[Any], wall_s: float) -> dict[str, Any]:
    """Prefix cache hit rate, TTFT p50/p90, aggregate output tokens/s of one run (pure)."""
    prompt = sum(r.prompt_tokens for r in replies)
    cached = sum(r.cached_tokens for r in replies)
    ttfts = sorted(r.ttft_ms for r in replies if r.ttft_ms is not None)
    tokens = sum(r.output_tokens for r in replies)
    return {
        "requests": len(replies),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefix_hit_rate": round(cached / prompt, 4) if prompt else None,
        "ttft_ms_p50": round(_quantile(ttfts, 0.5), 1) if ttfts else None,
        "ttft_ms_p90": round(_quantile(ttfts, 0.9), 1) if ttfts else None,
        "output_tokens": tokens,
        "throughput_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "wall_s": round(wall_s, 1),
    }


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, over the rounds both arms ran: each key's median per arm (ARMS order)
    and the median per-round ratio affinity / spread (rounds where spread is 0 or None
    left out of the ratio) (pure)."""
    out = []
    for workload in sorted({r["workload"] for r in rows}):
        at = {arm: {r["round"]: r for r in rows if r["workload"] == workload and r["arm"] == arm}
              for arm in ARMS}  # fmt: skip
        rounds = sorted(set(at["spread"]) & set(at["affinity"]))
        if not rounds:
            continue
        s: dict[str, Any] = {"kind": "summary", "workload": workload, "rounds": len(rounds)}
        for key in KEYS:
            values = {arm: [at[arm][i][key] for i in rounds if at[arm][i][key] is not None]
                      for arm in ARMS}  # fmt: skip
            s[key] = [round(statistics.median(v), 4) if v else None for v in values.values()]
            ratios = [
                at["affinity"][i][key] / at["spread"][i][key]
                for i in rounds
                if at["spread"][i][key] and at["affinity"][i][key] is not None
            ]
            s[f"{key}_ratio_median"] = round(statistics.median(ratios), 3) if ratios else None
        out.append(s)
    return out


def section(rows: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section: per kind of CPU and workload, the medians per arm."""
    lines = ["## Session and prefix affinity", ""]
    lines.append(measured_with(rows) + "; `spread` is Ray Serve's default routing.")
    for cpu in sorted({r["machine"]["cpu_class"] for r in rows if "machine" in r}):
        lines += ["", f"{cpu}:", "", "| workload | figure | spread | affinity | ratio |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for s in (r for r in rows if r["kind"] == "summary" and r["machine"]["cpu_class"] == cpu):
            for key in KEYS:
                spread, affinity = s[key]
                lines.append(f"| {s['workload']} | {key} | {spread} | {affinity} | "
                             f"{s[f'{key}_ratio_median']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from agentserve.engine.cpu_info import read_cpu_info

    from agentserve_bench.report import write_machine_rows
    from agentserve_bench.served_client import run_workload, workload_messages
    from agentserve_bench.speculative_served import _agentserve, _engine_factory, bench_spec

    cpu = read_cpu_info()
    print(f"machine: {cpu.describe()}", flush=True)
    # 2 x replicas engines share the machine: each reserves its KV cache up front (4 GiB by
    # default on CPU), and four 4 GiB reservations on a 24 GiB machine had Ray's memory
    # monitor kill the Serve controller while the engines started
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    n = args.conversations
    agents = agent_conversations(n, args.turns)
    single = workload_messages("coding", n)
    base = bench_spec("none", 0, args.port, n, None, engine=args.engine)
    spec, names = two_routing_spec(base, args.replicas, args.max_imbalance)
    common = {"date": date.today().isoformat(), "machine": cpu.as_dict(), "engine": args.engine,
              "replicas": args.replicas, "sessions": args.sessions,
              "max_imbalance_requests": args.max_imbalance}  # fmt: skip
    common["command"] = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows: list[dict[str, Any]] = []
    factory = _engine_factory(args.engine, "none")
    with _agentserve(spec, args.start_timeout_s, factory) as (url, _):
        for name in names.values():  # warm-up
            asyncio.run(run_workload(url, name, single[:2], 1, 16))
        for i in range(args.rounds):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                for openings in args.openings:
                    tag = f"r{i}-{arm}-{openings}"  # fresh sessions and prefixes every round
                    fresh = round_openings(agents, tag, distinct=openings == "distinct")
                    replies, wall = asyncio.run(
                        run_agents(url, names[arm], fresh, args.max_tokens, args.sessions, tag)
                    )
                    rows.append({"kind": "run", "workload": AGENT_WORKLOADS[openings],
                                 "round": i, "arm": arm, **arm_figures(replies, wall),
                                 **common})  # fmt: skip
                replies, wall = asyncio.run(
                    run_workload(url, names[arm], single, n, args.max_tokens)
                )
                rows.append({"kind": "run", "workload": "single-turn", "round": i, "arm": arm,
                             **arm_figures(replies, wall), **common})  # fmt: skip
                for row in rows[-1 - len(args.openings) :]:
                    print(f"  round {i} {arm} {row['workload']}: hit rate "
                          f"{row['prefix_hit_rate']}, TTFT p50 {row['ttft_ms_p50']} ms, "
                          f"{row['throughput_tokens_per_s']} tok/s", flush=True)  # fmt: skip
    records = rows + [{**s, **common} for s in summarize(rows)]
    write_machine_rows(args.docs, "affinity", records, cpu.cpu_class, section)
    return 0


def _openings(text: str) -> tuple[str, ...]:
    """--openings: a comma-separated subset of AGENT_WORKLOADS' keys, in the given order."""
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in values if v not in AGENT_WORKLOADS]
    if not values or unknown:
        raise argparse.ArgumentTypeError(
            f"expected shared and/or distinct, comma-separated; got {text!r}"
        )
    return values


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "affinity",
        help="session/prefix affinity vs Ray Serve's default routing: multi-turn agents' "
        "prefix cache hits, TTFT, tokens/s, on one platform",
        description=__doc__.split("\n\n")[1] + " Run it with nothing else on the machine.",
    )
    p.add_argument("--conversations", type=int, default=8, help="concurrent (default: 8)")
    p.add_argument("--turns", type=int, default=6, help="per conversation (default: 6)")
    p.add_argument("--replicas", type=int, default=2, help="per model (default: 2)")
    p.add_argument("--rounds", type=int, default=3, help="(default: %(default)s)")
    p.add_argument(
        "--max-imbalance",
        type=int,
        default=None,
        help="routing.max_imbalance_requests for the affinity model (default: the spec's, "
        "a sixteenth of a replica's batch slots)",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="per turn (default: 32)")
    p.add_argument(
        "--openings",
        type=_openings,
        default=("shared", "distinct"),
        help="comma-separated, how agent conversations begin: shared (one opening for all) "
        "and/or distinct (each its own) (default: shared,distinct)",
    )
    p.add_argument(
        "--no-sessions",
        dest="sessions",
        action="store_false",
        help="send no x-session-id: affinity keys on the leading prompt",
    )
    p.add_argument("--engine", choices=("vllm", "fake"), default="vllm",
                   help="fake: the pipeline only, no prefix cache (default: vllm)")  # fmt: skip
    p.add_argument("--port", type=int, default=8724, help="(default: %(default)s)")
    p.add_argument(
        "--kv-cache-gib",
        type=int,
        default=1,
        help="each engine's KV cache (VLLM_CPU_KVCACHE_SPACE, unless set): 1 GiB holds ~45k "
        "tokens of the bundled model, far more than the conversations need (default: 1)",
    )
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

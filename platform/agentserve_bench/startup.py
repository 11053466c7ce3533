"""`agentserve bench startup`: how long the embedded platform takes to serve, compiled or eager,
and what each costs in served speed; one run, one machine.

Per compile mode (vLLM's torch.compile, or `enforce_eager`) the platform starts twice on a
fresh Ray cluster each time ("first_start" in this run, then "restart"; caches from earlier
runs, such as the converted model, are warm for both). Each start is split into phases:
  ray_up        Ray, Serve and the app submitted (serve/local.start_local)
  engine        from there until /health says ready; vLLM's own log lines (Ray's session
                logs) give weights_load, compile (the CPU runner's compile warm-up; about 0
                when eager) and engine_init (profile, KV cache, warm-up: compile included)
  first_token   the first streamed token of a first request after ready
After the first start, held-out coding conversations (served_client) go through the HTTP
API one at a time: decode tokens/s and TTFT, the price of each mode.

`compile_choice` turns the rows into the choice for this kind of CPU (rule below);
the profile of this kind of CPU (agentserve/profiles) records it.
Records: docs/benchmarks/startup.json (a list; this machine's class's rows replaced).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from agentserve.engine.start_phases import log_phases, session_log_text

__all__ = [
    "MODES",
    "add_parser",
    "compile_choice",
    "run",
    "startup_section",
]

MODES = {"compiled": "1", "eager": "0"}  # label -> AGENTSERVE_CPU_COMPILE
# eager is chosen when it serves at least this fraction of compiled's decode speed (c=1)
# and is ready sooner: a start is paid once per (re)start and scale-up, decode speed always
EAGER_MIN_DECODE_RATIO = 0.95


def compile_choice(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The choice row from one run's start and served rows (pure); None when a mode is
    missing. Eager when its decode speed at c=1 is >= EAGER_MIN_DECODE_RATIO of compiled's
    and its mean ready time is lower; compiled otherwise."""
    served = {r["compile"]: r for r in records if r["kind"] == "served"}
    ready: dict[str, list[float]] = {}
    for r in records:
        if r["kind"] in ("first_start", "restart"):
            ready.setdefault(r["compile"], []).append(r["ready_s"])
    if set(served) != set(MODES) or set(ready) != set(MODES):
        return None
    ratio = served["eager"]["decode_tokens_per_s"] / served["compiled"]["decode_tokens_per_s"]
    mean = {mode: sum(v) / len(v) for mode, v in ready.items()}
    eager = ratio >= EAGER_MIN_DECODE_RATIO and mean["eager"] < mean["compiled"]
    return {
        "kind": "choice",
        "compile": not eager,
        "eager_decode_ratio": round(ratio, 3),
        "ready_s_mean": {mode: round(v, 1) for mode, v in mean.items()},
        "rule": f"eager if decode >= {EAGER_MIN_DECODE_RATIO}x compiled at c=1 and ready sooner",
    }


@contextlib.contextmanager
def _compile_env(value: str):
    saved = os.environ.get("AGENTSERVE_CPU_COMPILE")
    os.environ["AGENTSERVE_CPU_COMPILE"] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("AGENTSERVE_CPU_COMPILE", None)
        else:
            os.environ["AGENTSERVE_CPU_COMPILE"] = saved


def _one_start(spec: Any, args: argparse.Namespace, conversations: list | None) -> dict[str, Any]:
    """Start, wait ready, first token, (served figures), stop; the measured parts."""
    from agentserve.serve import local

    from agentserve_bench.overhead_phases import _wait_ready
    from agentserve_bench.served_client import level_figures, run_workload

    base = f"http://{spec.server.host}:{spec.server.port}"
    model = spec.models[0].name
    started = time.perf_counter()
    local.start_local(spec)
    try:
        ray_up = time.perf_counter() - started
        _wait_ready(base, args.start_timeout_s)
        ready = time.perf_counter() - started
        first = asyncio.run(run_workload(base, model, [_HELLO], 1, 8))[0][0]
        first_token = (first.first_s or first.last_s or first.start_s) - started
        phases = {"ray_up": round(ray_up, 1), "engine": round(ready - ray_up, 1)}
        phases |= log_phases(session_log_text())
        phases["first_token"] = round(first_token - ready, 2)
        out: dict[str, Any] = {"phases": phases, "ready_s": round(ready, 1)}
        out["first_token_s"] = round(first_token, 1)
        if conversations:
            replies, wall = asyncio.run(
                run_workload(base, model, conversations, 1, args.max_tokens)
            )
            out["served"] = level_figures(replies, wall)
        return out
    finally:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            local.stop_local()


_HELLO = [{"role": "user", "content": "Say hello."}]


def run(args: argparse.Namespace) -> int:
    from agentserve.engine.cpu_info import read_cpu_info

    from agentserve_bench.autoscale.measured_start import is_scale_up
    from agentserve_bench.report import replace_section, write_machine_rows
    from agentserve_bench.served_client import workload_messages
    from agentserve_bench.speculative_served import bench_spec

    path = Path(args.docs) / "benchmarks" / "startup.json"
    if args.report_only:
        rows = json.loads(path.read_text())
        replace_section(Path(args.docs) / "benchmarks.md", "startup", startup_section(rows))
        print(f"written: {Path(args.docs) / 'benchmarks.md'} (section startup)")
        return 0
    cpu = read_cpu_info()
    print(f"machine: {cpu.describe()}", flush=True)
    conversations = workload_messages("coding", args.num_prompts)
    spec = bench_spec("none", 0, args.port, 1, None)
    command = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    common = {"engine": "vllm", "date": date.today().isoformat(), "machine": cpu.as_dict()}
    common["command"] = command
    records: list[dict[str, Any]] = []
    for mode in args.modes:
        with _compile_env(MODES[mode]):
            for kind in ("first_start", "restart"):
                measured = _one_start(spec, args, conversations if kind == "first_start" else None)
                served = measured.pop("served", None)
                records.append({"kind": kind, "compile": mode, **measured, **common})
                print(
                    f"  {mode} {kind}: ready {measured['ready_s']} s, {measured['phases']}",
                    flush=True,
                )
                if served:
                    records.append({"kind": "served", "compile": mode, **served, **common})
                    print(f"  {mode} served: {served}", flush=True)
    choice = compile_choice(records)
    if choice:
        records.append({**choice, **common})
        print(f"choice for {cpu.cpu_class}: {'compile' if choice['compile'] else 'eager'} {choice}")
        _write_profile(Path(args.docs), cpu.cpu_class, choice["compile"], command)
    # the class's scale-up rows come from `bench autoscale-live` (live_scale_up): kept
    old = json.loads(path.read_text()) if path.exists() else []
    records += [r for r in old if is_scale_up(r, cpu.cpu_class)]
    write_machine_rows(args.docs, "startup", records, cpu.cpu_class, startup_section)
    return 0


def _write_profile(docs: Path, cpu_class: str, compiled: bool, command: str) -> None:
    """This kind of CPU's `compile` choice into its profile (agentserve/profiles)."""
    from agentserve_bench.profile_write import profile_dir, write_profile_section

    directory = profile_dir(docs)
    if directory is not None:
        rows = "docs/benchmarks/startup.json"
        write_profile_section(cpu_class, "compile", compiled, command, rows, directory)


_PHASES = ("ray_up", "engine", "weights_load", "compile", "engine_init", "first_token")


def startup_section(rows: list[dict[str, Any]]) -> str:
    """docs/benchmarks.md's "startup" section from startup.json's rows (pure)."""
    lines = [
        "## Start time: compiled vs eager (`agentserve bench startup`)\n",
        "Each start is a fresh local Ray cluster with the embedded default (plain decoding); "
        "ready = until /health answers ready, phases in seconds (weights_load, compile and "
        "engine_init are vLLM's own log figures; engine_init includes the compile warm-up). "
        "Served: held-out coding conversations, one at a time, after the first start. Raw "
        "figures: `benchmarks/startup.json`.\n",
        "| CPU | mode | kind | ready s | "
        + " | ".join(_PHASES)
        + " | decode tok/s | TTFT p50 ms |",
        "|---|---|---|---|" + "---|" * len(_PHASES) + "---|---|",
    ]
    served = {(r["machine"]["cpu_class"], r["compile"]): r for r in rows if r["kind"] == "served"}
    for r in rows:
        if r["kind"] not in ("first_start", "restart"):
            continue
        cpu = r["machine"]["cpu_class"]
        fig = served.get((cpu, r["compile"])) if r["kind"] == "first_start" else None
        phases = " | ".join(str(r["phases"].get(p, "-")) for p in _PHASES)
        decode = fig["decode_tokens_per_s"] if fig else "-"
        ttft = fig["ttft_ms_p50"] if fig else "-"
        lines.append(
            f"| {cpu} | {r['compile']} | {r['kind']} | {r['ready_s']} | {phases} "
            f"| {decode} | {ttft} |"
        )
    lines += _scale_up_lines(rows)
    for r in rows:
        if r["kind"] == "choice":
            mode = "compile" if r["compile"] else "eager"
            lines.append(
                f"\n**{r['machine']['cpu_class']}** ({r['machine']['model']}, "
                f"{r['date']}): `{r['command']}` -> **{mode}** (eager decode "
                f"{r['eager_decode_ratio']}x compiled; mean ready {r['ready_s_mean']}; "
                f"rule: {r['rule']}). The kind of CPU's profile (agentserve/profiles) holds it."
            )
    return "\n".join(lines) + "\n"


_SCALE_UP_PHASES = ("to_starting", "starting_to_ready", "first_token")


def _scale_up_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The scale-up rows (`agentserve bench autoscale-live`, live_scale_up.py) as a table."""
    ups = [r for r in rows if r["kind"] == "scale_up"]
    if not ups:
        return []
    lines = [
        "\nScale-up replicas, from `agentserve bench autoscale-live` (the SLA policy adds a "
        "replica beside one serving the trace; seconds from the policy's decision, "
        "agentserve_bench/autoscale/live_scale_up.py):\n",
        "| CPU | mode | live phase | date | ready s | " + " | ".join(_SCALE_UP_PHASES)
        + " | first token s |",
        "|---|---|---|---|---|" + "---|" * len(_SCALE_UP_PHASES) + "---|",
    ]  # fmt: skip
    for r in ups:
        phases = " | ".join(str(r["phases"].get(p, "-")) for p in _SCALE_UP_PHASES)
        lines.append(
            f"| {r['machine']['cpu_class']} | {r['compile']} | {r['live_phase']} | {r['date']} "
            f"| {r['ready_s']} | {phases} | {r['first_token_s']} |"
        )
    return lines


def _modes(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"{unknown or text!r}: choose from {', '.join(MODES)}")
    return modes


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "startup",
        help="start time (phases) and served decode speed, compiled vs eager, one run",
        description="Starts the embedded platform (agentserve up's app, plain decoding) twice "
        "per compile mode, splitting each start into phases, and measures served decode "
        "speed after the first; writes docs/benchmarks/startup.json with the choice for this "
        "kind of CPU (its profile in agentserve/profiles holds it). Run it with "
        "nothing else on the machine.",
    )
    p.add_argument(
        "--modes", default=list(MODES), type=_modes,
        help="comma list of compiled, eager (default: both)",
    )  # fmt: skip
    p.add_argument("--num-prompts", type=int, default=6, help="coding conversations (default: 6)")
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument("--port", type=int, default=8721, help="(default: %(default)s)")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: rewrite the docs section from benchmarks/startup.json",
    )
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

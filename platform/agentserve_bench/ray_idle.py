"""`agentserve bench ray-idle`: what an idle agentserve's Ray costs an engine decoding beside
it, with Ray's reader-less loops off (as `agentserve up` starts it) and on (Ray's own
defaults for them: metrics, task events, log monitor; agentserve/ray_env.py, UNREAD).

On a small machine the engine's OpenMP threads hold every core while it decodes, and each
wake-up of another process takes a core from one of them (a step waits for its slowest
thread), so the platform's idle processes are a tax on every token. Here the engine is
vLLM's own server (plain decoding, the embedded model and engine settings), and the
neighbour an `agentserve up` with the fake engine, so only Ray, Serve and the platform's
processes run beside it. Each round measures the server alone and beside each neighbour,
in rotating order (the machine drifts: only paired ratios say anything), and the
neighbour's CPU seconds per 30 s while idle, by process. Writes
docs/benchmarks/ray-idle.json (this kind of CPU's rows replaced) and the "ray-idle" section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

from agentserve_bench.report import measured_with, paired_rounds

__all__ = ["ARMS", "NEIGHBOURS", "add_parser", "cpu_seconds", "run", "summarize"]

# Ray's own values for what agentserve turns off (ray_env.UNREAD; serve/local.py's monitor)
NEIGHBOURS: dict[str, dict[str, str]] = {
    "lean": {},
    "unread-on": {
        "RAY_enable_metrics_collection": "1",
        "RAY_task_events_report_interval_ms": "1000",
        "AGENTSERVE_RAY_LOG_MONITOR": "keep",
    },
}
ARMS = ("alone", *NEIGHBOURS)
_FAKE_SPEC = """
models:
  - name: smollm2-135m-instruct
    engine: fake
    replicas: {min_replicas: 1, max_replicas: 1, num_cpus: 1}
"""


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of `pid` and its descendants, by process name."""
    import psutil

    out: dict[str, float] = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            name = proc.name()
            out[name] = out.get(name, 0.0) + times.user + times.system
    return out


@contextlib.contextmanager
def _neighbour(env: dict[str, str], port: int, logs: Path) -> Iterator[subprocess.Popen]:
    from agentserve_bench.overhead_peers import stop_group, wait_models

    spec = logs / "ray-idle-neighbour.yaml"
    spec.write_text(_FAKE_SPEC)
    log = logs / "ray-idle-neighbour.log"
    command = [sys.executable, "-m", "agentserve.cli", "up", "--spec", str(spec)]
    command += ["--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env}, start_new_session=True)  # fmt: skip
    try:
        wait_models(f"http://127.0.0.1:{port}", 300, proc, log, "agentserve up")
        deadline = time.monotonic() + 300  # /v1/models answers before every replica is up
        while '"event": "ready"' not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agentserve up did not get ready (log: {log})")
            time.sleep(1.0)
        yield proc
    finally:
        stop_group(proc)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Paired medians: each neighbour against alone, and lean against unread-on (pure)."""
    out = []
    levels = [r for r in rows if r.get("kind") == "level"]
    pairs = [("alone", "lean"), ("alone", "unread-on"), ("unread-on", "lean")]
    for first, second in pairs:
        for p in paired_rounds(levels, "arm", (first, second), ("decode_tokens_per_s",)):
            out.append({"kind": "summary", "arms": f"{second} / {first}",
                        "concurrency": p["concurrency"], "rounds": p["rounds"],
                        "decode_tokens_per_s": [round(x, 2) for x in p["decode_tokens_per_s"]],
                        "ratio_median": p["decode_tokens_per_s_ratio_median"],
                        "higher_in_rounds": p["decode_tokens_per_s_higher_in_rounds"]})  # fmt: skip
    return out


def section(records: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section (pure)."""
    lines = ["| CPU | arms | rounds | decode tok/s (medians) | paired ratio | higher in |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for s in (r for r in records if r.get("kind") == "summary"):
        a, b = s["decode_tokens_per_s"]
        higher = f"{s['higher_in_rounds']} of {s['rounds']}"
        lines.append(
            f"| {s['machine']['cpu_class']} | {s['arms']} | {s['rounds']} | {b} / {a} "
            f"| {s['ratio_median']}x | {higher} |"
        )
    idle = []
    for (cpu, arm), windows in _idle_windows(records).items():
        names = sorted({k for w in windows for k in w}, key=lambda k: -_mean(windows, k))
        top = ", ".join(f"{k} {_mean(windows, k)}" for k in names[:8])
        total = round(sum(_mean(windows, k) for k in names), 2)
        idle.append(f"{cpu} {arm}: {total} CPU-s per 30 s ({top})")
    return (
        f"{measured_with(records)}: vLLM's server decoding (plain, coding, c=1) alone and "
        "beside an idle `agentserve up` (fake engine), rounds in rotating order, ratios "
        "paired within a round.\n\n" + "\n".join(lines) + "\n\nThe neighbour idle (means "
        "over rounds): " + "; ".join(idle) + ".\n"
    )


def _idle_windows(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("kind") == "idle_cpu":
            out.setdefault((r["machine"]["cpu_class"], r["arm"]), []).append(r["per_30s"])
    return out


def _mean(windows: list[dict[str, float]], name: str) -> float:
    return round(sum(w.get(name, 0.0) for w in windows) / len(windows), 2)


def _idle_cpu(pid: int, window_s: float) -> dict[str, float]:
    before = cpu_seconds(pid)
    time.sleep(window_s)
    after = cpu_seconds(pid)
    return {k: round((v - before.get(k, 0.0)) * 30 / window_s, 2) for k, v in after.items()}


def run(args: argparse.Namespace) -> int:
    from agentserve.engine.cpu_info import read_cpu_info

    from agentserve_bench.overhead_phases import free_port
    from agentserve_bench.report import write_machine_rows
    from agentserve_bench.served_client import level_figures, run_workload, workload_messages
    from agentserve_bench.speculative_served import _vllm_serve, bench_spec

    cpu = read_cpu_info()
    print(f"machine: {cpu.describe()}", flush=True)
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    conversations = workload_messages("coding", args.num_prompts)
    spec = bench_spec("none", 0, free_port(), 1, None)
    model = spec.models[0].name
    common = {"date": date.today().isoformat(), "machine": cpu.as_dict(), "engine": "vllm"}
    common["command"] = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows: list[dict[str, Any]] = []
    with _vllm_serve(spec, args.start_timeout_s, logs) as (base, _):
        asyncio.run(run_workload(base, model, conversations[:2], 1, 32))  # warm-up
        for i in range(args.rounds):
            for arm in ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]:
                with contextlib.ExitStack() as stack:
                    if arm != "alone":
                        proc = stack.enter_context(_neighbour(NEIGHBOURS[arm], free_port(), logs))
                        time.sleep(args.settle_s)  # start-up's last work done
                        per = _idle_cpu(proc.pid, args.window_s)
                        total = round(sum(per.values()), 2)
                        rows.append({"kind": "idle_cpu", "round": i, "arm": arm, "per_30s": per,
                                     "total_per_30s": total, **common})  # fmt: skip
                    replies, wall = asyncio.run(
                        run_workload(base, model, conversations, 1, args.max_tokens)
                    )
                f = level_figures(replies, wall)
                rows.append({"kind": "level", "round": i, "arm": arm, "concurrency": 1,
                             **f, **common})  # fmt: skip
                idle = (
                    f", neighbour idle {rows[-2]['total_per_30s']} CPU-s/30 s"
                    if arm != "alone"
                    else ""
                )
                print(f"  round {i} {arm:9s}: {f['decode_tokens_per_s']} tok/s{idle}", flush=True)
    records = rows + [{**s, **common} for s in summarize(rows)]
    for s in records[len(rows) :]:
        print(
            f"  {s['arms']}: {s['ratio_median']}x ({s['higher_in_rounds']} of {s['rounds']} higher)"
        )
    write_machine_rows(args.docs, "ray-idle", records, cpu.cpu_class, section)
    return 0


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "ray-idle",
        help="vLLM's server alone vs beside an idle agentserve (Ray's unread loops off / on)",
        description=__doc__.split("\n\n")[1] + " Run it with nothing else on the machine.",
    )
    p.add_argument("--rounds", type=int, default=3, help="(default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=12, help="coding conversations (default: 12)")
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument(
        "--settle-s",
        type=float,
        default=10.0,
        help="seconds to wait after the neighbour is ready (default: %(default)s)",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=15.0,
        help="then its idle CPU is measured over this long (default: %(default)s)",
    )
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument(
        "--logs", default="/tmp/agentserve-bench-ray-idle", help="(default: %(default)s)"
    )
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

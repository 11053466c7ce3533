"""The scale-up replicas of `agentserve bench autoscale-live`, as startup.json rows.

A scale-up in the live run is the real thing: the SLA policy decides in the Serve
controller, Ray starts a replica beside one that serves the trace (on the other core), and
the trace's requests reach it. Each one becomes a `{"kind": "scale_up", ...}` row of
docs/benchmarks/startup.json (the startup benchmark's first_start and restart rows stay):

  decision          the policy's log line "N -> N+1 replicas" (the controller's clock)
  to_starting       decision -> the replica seen STARTING (Serve's status, polled)
  starting_to_ready STARTING -> RUNNING: actor, imports, engine (and compile, when cold)
  first_token       the time to first token of the first request sent after RUNNING (Ray's
                    router sends it to the replica with fewer requests: the new, empty one)
  ready_s           decision -> RUNNING; first_token_s: ready_s + first_token, the first
                    token of a request that arrives as the replica turns RUNNING (the
                    trace's own gap until its next request is not the replica's)

Before the phases the bench starts both replicas once (`live.prewarm`): it binds each replica's
OpenMP threads to its own core, and vLLM's compile cache key covers that binding, so the
replica on the second core would otherwise compile once per machine at the first phase's
scale-up (a bench artifact: on a node, a model's replicas share one environment and key).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["decision_times", "record_scale_ups", "scale_up_episodes", "scale_up_rows"]

_LOG_TIME = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})")
_UP = re.compile(r"agentserve policy: (\d+) -> (\d+) replicas")


def decision_times(lines: Sequence[str]) -> list[float]:
    """Wall-clock seconds (epoch, the machine's local time as Ray logs it) of the policy's
    scale-up lines, in order (pure)."""
    out = []
    for line in lines:
        stamp, up = _LOG_TIME.search(line), _UP.search(line)
        if stamp and up and int(up.group(2)) > int(up.group(1)):
            parsed = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
            out.append(time.mktime(parsed.timetuple()) + int(stamp.group(2)) / 1000)
    return out


def scale_up_episodes(phase: Mapping[str, Any]) -> list[dict[str, float]]:
    """Each scale-up of one phase report (live.run_phase): seconds from the phase's start
    of the decision (None without a logged one), STARTING and RUNNING, and the time to
    first token of the first request sent after RUNNING (None when none came) (pure)."""
    points = phase["timeline"]
    t0_wall = phase.get("t0_wall")  # reports from before it was recorded: no decisions
    logged = decision_times(phase.get("policy_decisions", [])) if t0_wall is not None else []
    decisions = [t - t0_wall for t in logged]
    records = [r for r in phase.get("records", []) if r.get("ttft_ms") is not None]
    episodes, start = [], None
    for point in points:
        if start is None and point["states"].get("STARTING"):
            start = (point["t_s"], point["running"])
        elif start is not None and point["running"] > start[1]:
            starting, running = start[0], point["t_s"]
            # the decision Ray acted on: the last one logged before the replica showed up
            # (t0_wall is taken before the first poll, so a decision may lead it slightly)
            decided = [d for d in decisions if d <= starting + 1.0]
            after = [r for r in records if r["arrival_s"] >= running]
            first = min(after, key=lambda r: r["arrival_s"], default=None)
            episodes.append({
                "decision_s": decided[-1] if decided else None,
                "starting_s": starting,
                "running_s": running,
                "ttft_s": first["ttft_ms"] / 1000 if first else None,
            })  # fmt: skip
            start = None
    return episodes


def scale_up_rows(report: Mapping[str, Any], common: Mapping[str, Any]) -> list[dict[str, Any]]:
    """startup.json "scale_up" rows (see the module doc) from a live report; `common`
    holds engine, compile, date, machine and command (pure)."""
    rows = []
    for name, phase in report["phases"].items():
        for i, ep in enumerate(scale_up_episodes(phase)):
            origin = ep["decision_s"] if ep["decision_s"] is not None else ep["starting_s"]
            phases = {
                "to_starting": round(ep["starting_s"] - origin, 1),
                "starting_to_ready": round(ep["running_s"] - ep["starting_s"], 1),
            }
            ready, ttft = ep["running_s"] - origin, ep["ttft_s"]
            if ttft is not None:
                phases["first_token"] = round(ttft, 2)
            rows.append({
                "kind": "scale_up",
                "phases": phases,
                "ready_s": round(ready, 1),
                "first_token_s": None if ttft is None else round(ready + ttft, 1),
                "from": "decision" if ep["decision_s"] is not None else "starting",
                "live_phase": f"priority {name}, scale-up {i + 1}",
                **common,
            })  # fmt: skip
    return rows


def record_scale_ups(rows: list[dict[str, Any]], cpu_class: str, docs: Path) -> Path:
    """Replace this kind of CPU's "scale_up" rows of docs/benchmarks/startup.json with
    `rows` (the startup benchmark's rows stay) and rewrite its docs section."""
    from agentserve_bench.autoscale.measured_start import is_scale_up
    from agentserve_bench.report import replace_section
    from agentserve_bench.startup import startup_section

    path = Path(docs) / "benchmarks" / "startup.json"
    old = json.loads(path.read_text()) if path.exists() else []
    kept = [r for r in old if not is_scale_up(r, cpu_class)]
    path.write_text(json.dumps(kept + rows, indent=1) + "\n")
    replace_section(Path(docs) / "benchmarks.md", "startup", startup_section(kept + rows))
    return path

"""The replica start time the simulator uses: measured, from docs/benchmarks/startup.json
(`agentserve bench startup`, agentserve_bench/startup.py), for the engine it simulates.

A simulated scale-up starts a replica beside one that already started, so its caches (the
converted model, vLLM's CPU compile cache) are warm. Per kind of CPU,
the largest `ready_s` of the engine's "scale_up" rows (`agentserve bench autoscale-live`:
from the policy's decision to the new replica running beside a serving one), else of its
"restart" rows (a fresh Ray cluster with warm caches: Ray's own start, a few seconds,
included), else of its "first_start" rows; only the rows of the compile mode the kind
chose (its "choice" row), every mode where it has none. The figure is the largest over
the kinds, as the live adapter plans with the largest report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentserve.autoscale.policy_types import DEFAULT_REPLICA_START_S

from agentserve_bench.report import default_docs

__all__ = [
    "SCALE_UP_KINDS",
    "engine_start_s",
    "is_scale_up",
    "scale_up_start_s",
    "startup_path",
]

SCALE_UP_KINDS = ("scale_up", "restart", "first_start")
"""startup.json's start kinds, the closest to a scale-up first."""


def startup_path(docs: Path | None = None) -> Path:
    """Where `agentserve bench startup` writes its rows."""
    return (docs or default_docs()) / "benchmarks" / "startup.json"


def is_scale_up(row: Mapping[str, Any], cpu_class: str) -> bool:
    """Whether a startup.json row is a scale-up (`bench autoscale-live`) on `cpu_class`."""
    return row.get("kind") == "scale_up" and row.get("machine", {}).get("cpu_class") == cpu_class


def _chosen_modes(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """CPU class -> the compile mode its "choice" row chose ("compiled" or "eager")."""
    return {
        r["machine"]["cpu_class"]: "compiled" if r["compile"] else "eager"
        for r in rows
        if r.get("kind") == "choice" and "machine" in r
    }


def scale_up_start_s(rows: list[Mapping[str, Any]], engine: str = "vllm") -> float | None:
    """A scale-up's start (seconds) from startup.json's rows (pure; see the module doc);
    None when no row measures `engine`."""
    chosen = _chosen_modes(r for r in rows if r.get("engine") == engine)

    def counted(r: Mapping[str, Any]) -> bool:
        cpu = r.get("machine", {}).get("cpu_class")
        return r.get("engine") == engine and chosen.get(cpu, r.get("compile")) == r.get("compile")

    starts = [r for r in rows if counted(r) and "ready_s" in r]
    per_class = []
    for cpu in {r.get("machine", {}).get("cpu_class") for r in starts}:
        mine = [r for r in starts if r.get("machine", {}).get("cpu_class") == cpu]
        for kind in SCALE_UP_KINDS:
            ready = [float(r["ready_s"]) for r in mine if r.get("kind") == kind]
            if ready:
                per_class.append(max(ready))
                break
    return max(per_class, default=None)


def engine_start_s(engine: str = "vllm", path: Path | None = None) -> float:
    """The simulated replica start of `engine`: measured (startup.json at `path`, the
    repository's by default); DEFAULT_REPLICA_START_S, the policy's own fallback, when
    nothing measures it."""
    path = path or startup_path()
    rows = json.loads(path.read_text()) if path.is_file() else []
    measured = scale_up_start_s(rows, engine)
    return DEFAULT_REPLICA_START_S if measured is None else measured

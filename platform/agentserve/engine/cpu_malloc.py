"""The memory allocator a CPU engine's processes preload: glibc's own malloc (nothing
preloaded), tcmalloc or jemalloc; the choice is measured per kind of CPU by the served
benchmark (engine/cpu_settings.py holds the settings bundles and the measured defaults).

vLLM's CPU engine allocates and frees the activations of every step; with glibc's malloc
the large ones come from and go back to the kernel (mmap / munmap above the mmap threshold,
trimmed heaps), so each step pays page faults and zeroed pages again. A caching allocator
keeps them. vLLM's CPU documentation recommends preloading tcmalloc for that reason.

Where the libraries come from: jemalloc ships inside Ray's wheel (`ray/core/libjemalloc.so`),
so every agentserve install has it; tcmalloc is the system's (Debian/Ubuntu:
`libtcmalloc-minimal4`; the CPU image installs it). A library that is asked for but not found
leaves glibc's malloc, with a warning from `missing_warning`.

The library travels by LD_PRELOAD in the engine's environment: the engine core process the
replica spawns loads it at exec (the replica itself, already running, keeps its allocator).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ALLOCATORS", "GLIBC", "LIBRARY_NAMES", "SYSTEM_LIB_DIRS", "malloc_library"]

GLIBC = "glibc"
ALLOCATORS = (GLIBC, "tcmalloc", "jemalloc")
LIBRARY_NAMES: dict[str, tuple[str, ...]] = {
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so"),
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
}
SYSTEM_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


def _ray_core_dir() -> Path | None:
    """Ray's `core` directory (its jemalloc), found without importing Ray."""
    try:
        spec = importlib.util.find_spec("ray")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) / "core" if locations else None


def malloc_library(
    allocator: str, prefix: str = sys.prefix, dirs: Iterable[str] | None = None
) -> Path | None:
    """The shared library to preload for `allocator`, or None (glibc, or not installed).
    Looks in the environment's own lib directory first, then (jemalloc) Ray's wheel, then
    the system's library directories (`dirs`, default SYSTEM_LIB_DIRS)."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"AGENTSERVE_CPU_MALLOC={allocator!r}: one of {', '.join(ALLOCATORS)}")
    if allocator == GLIBC:
        return None
    places = [Path(prefix) / "lib"]
    if allocator == "jemalloc":
        ray_core = _ray_core_dir()
        if ray_core is not None:
            places.append(ray_core)
    places += [Path(d) for d in (SYSTEM_LIB_DIRS if dirs is None else dirs)]
    for place in places:
        for name in LIBRARY_NAMES[allocator]:
            candidate = place / name
            if candidate.is_file():
                return candidate
    return None

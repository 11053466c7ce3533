"""What CPU the engine runs on: model, usable cores and the vector features that decide how
fast bf16 and multi-token verification are (AVX-512, AVX512-BF16, AMX, AVX2).

`cpu_class` names the kind of machine that measured figures hold for: a default chosen from
one kind's figures is never applied to another kind (drafters.default_speculation).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["CPU_CLASSES", "CpuInfo", "cpu_class", "read_cpu_info"]

# the flags (as /proc/cpuinfo spells them) that matter for the engine's kernels
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
CPU_CLASSES = ("amx", "avx512_bf16", "avx512", "avx2", "other")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores: int  # usable by this process (affinity), not the host's count
    features: tuple[str, ...]  # the FEATURES this CPU has

    @property
    def cpu_class(self) -> str:
        return cpu_class(self.features)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "features": list(self.features), "cpu_class": self.cpu_class}

    def describe(self) -> str:
        """One line for banners: 'AMD EPYC, 2 cores, avx2 (no bf16 instructions)'."""
        flags = ", ".join(self.features) or "no AVX2"
        bf16 = "" if {"avx512_bf16", "amx_bf16"} & set(self.features) else " (no bf16 instructions)"
        return f"{self.model}, {self.cores} cores, {flags}{bf16}"


def cpu_class(features: tuple[str, ...] | list[str]) -> str:
    """The strongest class the features give (pure): amx > avx512_bf16 > avx512 > avx2."""
    have = set(features)
    if "amx_bf16" in have:
        return "amx"
    if "avx512_bf16" in have:
        return "avx512_bf16"
    if "avx512f" in have:
        return "avx512"
    return "avx2" if "avx2" in have else "other"


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model name, FEATURES present) from /proc/cpuinfo text (pure; first processor)."""
    model, flags = "unknown CPU", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, tuple(f for f in FEATURES if f in flags)


def read_cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """This machine's CpuInfo (model 'unknown CPU' and no features where /proc is absent)."""
    try:
        model, features = parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    except OSError:
        model, features = "unknown CPU", ()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return CpuInfo(model, cores, features)

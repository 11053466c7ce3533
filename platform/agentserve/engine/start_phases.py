"""Where an engine's start is, and how long its phases took, from vLLM's own log lines.

vLLM logs the start of an engine in its worker processes (under Ray: the session's
worker-*.out/.err files): the engine's config, "Loading weights took X seconds", the CPU
runner's compile warm-up ("Warming up model for the compilation" ... "Warming up done")
and "init engine (profile, create kv cache, warmup model) took X s". `agentserve up`
reads them while it waits, to say which phase the start is in and, once ready, what each
took; `agentserve bench startup` records the same figures (docs/benchmarks/startup.json).
Everything here but `session_log_text` is pure.
"""

from __future__ import annotations

import contextlib
import glob
import re
from datetime import datetime
from pathlib import Path

__all__ = ["PHASE_PATTERNS", "current_phase", "describe_phases", "log_phases", "session_log_text"]

PHASE_PATTERNS = {
    "weights_load": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "engine_init": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
    ),
}
# vLLM's CPU model runner logs the compile warm-up's start and end, not its length
_STAMP = r"(\d\d-\d\d \d\d:\d\d:\d\d)"
_COMPILE_BEGIN = re.compile(_STAMP + r" \[[^\]]+\] Warming up model for the compilation")
_COMPILE_END = re.compile(_STAMP + r" \[[^\]]+\] Warming up done")
_ENGINE_BEGIN = re.compile(r"Initializing a V1 LLM engine|Starting to load model")
# (marker -> the phase the start is in once it is logged), furthest first
_NOW = (
    (PHASE_PATTERNS["engine_init"], "engine ready; the replica is finishing its start"),
    (_COMPILE_END, "profiling memory and creating the KV cache"),
    (_COMPILE_BEGIN, "compiling the model (torch.compile; later starts load the cache)"),
    (PHASE_PATTERNS["weights_load"], "preparing the compile warm-up"),
    (_ENGINE_BEGIN, "loading weights"),
)
_LABELS = {"weights_load": "weights", "compile": "compile", "engine_init": "engine init"}


def log_phases(text: str) -> dict[str, float]:
    """vLLM's own phase figures in log text: the last of each kind found; "compile" from
    the CPU runner's warm-up lines (whole seconds: vLLM stamps its lines so)."""
    out = {}
    for name, pattern in PHASE_PATTERNS.items():
        found = pattern.findall(text)
        if found:
            out[name] = round(float(found[-1]), 2)
    begin, end = _COMPILE_BEGIN.findall(text), _COMPILE_END.findall(text)
    if begin and end:
        fmt = "%m-%d %H:%M:%S"
        took = datetime.strptime(end[-1], fmt) - datetime.strptime(begin[-1], fmt)
        out["compile"] = took.total_seconds()
    return out


def current_phase(text: str) -> str | None:
    """The phase an engine start is in: after the furthest of vLLM's markers in `text`
    (the phases come in order; None before the engine logs anything: Ray and the replica
    are still starting)."""
    return next((label for pattern, label in _NOW if pattern.search(text)), None)


def describe_phases(phases: dict[str, float]) -> str:
    """'weights 0.2 s, compile 78 s, engine init 80.9 s' (the known ones, in start order)."""
    return ", ".join(f"{_LABELS[k]} {phases[k]:g} s" for k in _LABELS if k in phases)


def session_log_text(root: str = "/tmp/ray/session_latest/logs") -> str:
    """The local Ray session's worker logs, where vLLM's engine lines land."""
    parts = []
    for path in sorted(glob.glob(f"{root}/worker-*.out") + glob.glob(f"{root}/worker-*.err")):
        with contextlib.suppress(OSError):
            parts.append(Path(path).read_text(errors="replace"))
    return "\n".join(parts)

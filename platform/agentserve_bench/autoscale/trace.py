"""Seeded multi-agent request traces: sessions are chains of LLM calls with tool pauses,
from two tenant classes (interactive, batch), arriving on a diurnal ramp with a sudden
burst. A trace is plain data, saved to and loaded from JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Call", "Session", "Trace", "TraceConfig", "generate_trace"]


@dataclass(frozen=True)
class Call:
    """One LLM call; the session's next call arrives `pause_s` after this one finishes.
    `new_tokens` is the part of the prompt not in the prefix cache (the whole prompt for a
    session's first call; the tool result afterwards, with session affinity)."""

    prompt_tokens: int
    output_tokens: int
    pause_s: float
    new_tokens: int


@dataclass(frozen=True)
class Session:
    """One agent run of one tenant: calls in order, the first at `start_s`."""

    id: int
    tenant: str
    start_s: float
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class TenantClass:
    """How one tenant's sessions look; token counts are lognormal around their medians."""

    name: str
    sessions_per_min: float
    calls: tuple[int, int]
    prompt_tokens: int
    output_tokens: int
    pause_s: float
    burst: bool


def _default_classes() -> tuple[TenantClass, ...]:
    return (
        TenantClass("interactive", 80.0, (2, 6), 300, 100, 2.0, burst=True),
        TenantClass("batch", 14.0, (6, 12), 500, 180, 0.5, burst=False),
    )


@dataclass(frozen=True)
class TraceConfig:
    """Trace shape. Session rates are peaks; the diurnal ramp scales them by
    low + (1 - low) * sin(pi * t / duration); the burst multiplies bursty tenants' rate."""

    seed: int = 7
    duration_s: float = 1800.0
    diurnal_low: float = 0.2
    burst_start_s: float = 1050.0
    burst_s: float = 90.0
    burst_factor: float = 3.0
    classes: tuple[TenantClass, ...] = field(default_factory=_default_classes)


@dataclass(frozen=True)
class Trace:
    config: TraceConfig
    sessions: tuple[Session, ...]

    @property
    def num_calls(self) -> int:
        return sum(len(s.calls) for s in self.sessions)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        cfg = data["config"]
        classes = tuple(
            TenantClass(**{**c, "calls": tuple(c["calls"])}) for c in cfg.pop("classes")
        )
        sessions = tuple(
            Session(s["id"], s["tenant"], s["start_s"], tuple(Call(**c) for c in s["calls"]))
            for s in data["sessions"]
        )
        return cls(TraceConfig(**cfg, classes=classes), sessions)


def rate_multiplier(cfg: TraceConfig, t: float, bursty: bool) -> float:
    """Session-rate multiplier at time t (diurnal ramp, times the burst when it applies)."""
    diurnal = cfg.diurnal_low + (1 - cfg.diurnal_low) * math.sin(math.pi * t / cfg.duration_s)
    in_burst = bursty and cfg.burst_start_s <= t < cfg.burst_start_s + cfg.burst_s
    return diurnal * (cfg.burst_factor if in_burst else 1.0)


def _session_starts(cfg: TraceConfig, cls: TenantClass, rng: np.random.Generator) -> list[float]:
    """Non-homogeneous Poisson arrivals by thinning."""
    peak = cls.sessions_per_min / 60.0 * (cfg.burst_factor if cls.burst else 1.0)
    starts, t = [], 0.0
    while True:
        t += rng.exponential(1.0 / peak)
        if t >= cfg.duration_s:
            return starts
        if rng.random() * peak <= cls.sessions_per_min / 60.0 * rate_multiplier(cfg, t, cls.burst):
            starts.append(t)


def _lognormal_int(rng: np.random.Generator, median: float, sigma: float = 0.5) -> int:
    return max(1, round(median * math.exp(sigma * rng.standard_normal())))


def _calls(cls: TenantClass, rng: np.random.Generator) -> tuple[Call, ...]:
    n = int(rng.integers(cls.calls[0], cls.calls[1] + 1))
    prompt = new = _lognormal_int(rng, cls.prompt_tokens)
    calls = []
    for i in range(n):
        output = _lognormal_int(rng, cls.output_tokens)
        pause = 0.0 if i == n - 1 else float(rng.exponential(cls.pause_s))
        calls.append(Call(prompt, output, round(pause, 3), new))
        new = _lognormal_int(rng, 60)  # the tool result; the context keeps growing
        prompt += output + new
    return tuple(calls)


def generate_trace(cfg: TraceConfig | None = None) -> Trace:
    """A deterministic trace for `cfg` (same seed, same trace)."""
    cfg = cfg or TraceConfig()
    rng = np.random.default_rng(cfg.seed)
    sessions: list[tuple[float, str, tuple[Call, ...]]] = []
    for cls in cfg.classes:
        sessions += [
            (round(t, 3), cls.name, _calls(cls, rng)) for t in _session_starts(cfg, cls, rng)
        ]
    sessions.sort(key=lambda s: (s[0], s[1]))
    return Trace(
        cfg, tuple(Session(i, name, t, calls) for i, (t, name, calls) in enumerate(sessions))
    )

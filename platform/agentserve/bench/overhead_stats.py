"""Load generation and figures for `agentserve bench overhead`: one request's timing, a
concurrency level's statistics, bare-vs-platform ratios, the verdict and the table."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "TARGET_OVERHEAD",
    "OneRequest",
    "RequestTiming",
    "compare_levels",
    "fmt_number",
    "level_stats",
    "markdown_table",
    "run_level",
    "verdict",
]

TARGET_OVERHEAD = 0.05  # issue: the platform adds <= 5% at concurrency 1


@dataclass(frozen=True)
class RequestTiming:
    """One request as the caller saw it (perf_counter seconds). `first_s` / `last_s`: the
    first and last chunk carrying output; None when no output arrived."""

    start_s: float
    first_s: float | None
    last_s: float | None
    output_tokens: int
    prompt_tokens: int

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_s is None else 1000 * (self.first_s - self.start_s)

    @property
    def tpot_ms(self) -> float | None:
        """Per output token after the first; None below two tokens."""
        if self.first_s is None or self.last_s is None or self.output_tokens < 2:
            return None
        return 1000 * (self.last_s - self.first_s) / (self.output_tokens - 1)


OneRequest = Callable[[str, str], Awaitable[RequestTiming]]
"""(request id, prompt text) -> the request's timing; generates max_tokens tokens."""


# -- load and statistics (pure except for the clock) ------------------------------------------
async def run_level(
    one: OneRequest, prompts: Sequence[str], concurrency: int, requests: int, tag: str
) -> tuple[list[RequestTiming], float]:
    """`requests` requests, `concurrency` at a time, prompts in turn; (timings, wall s)."""
    counter = itertools.count()
    timings: list[RequestTiming] = []

    async def worker() -> None:
        while (i := next(counter)) < requests:
            timings.append(await one(f"{tag}-{i}", prompts[i % len(prompts)]))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return timings, time.perf_counter() - start


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


def level_stats(timings: Sequence[RequestTiming], wall_s: float) -> dict[str, Any]:
    """Figures of one phase at one concurrency: tokens/s over the wall time, TPOT and TTFT
    (mean, p50, p95 over requests), token totals."""
    tpot = [t.tpot_ms for t in timings if t.tpot_ms is not None]
    ttft = [t.ttft_ms for t in timings if t.ttft_ms is not None]
    tokens = sum(t.output_tokens for t in timings)
    return {
        "requests": len(timings),
        "output_tokens": tokens,
        "prompt_tokens": sum(t.prompt_tokens for t in timings),
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "tpot_ms": _round(np.mean(tpot)) if tpot else None,
        "tpot_ms_p50": _round(np.percentile(tpot, 50)) if tpot else None,
        "tpot_ms_p95": _round(np.percentile(tpot, 95)) if tpot else None,
        "ttft_ms": _round(np.mean(ttft)) if ttft else None,
        "ttft_ms_p95": _round(np.percentile(ttft, 95)) if ttft else None,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def compare_levels(
    bare: dict[int, dict[str, Any]], platform: dict[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per concurrency: both phases' figures, overhead_ratio (platform / bare mean TPOT),
    throughput_ratio (platform / bare tokens/s), and whether both generated the same
    prompt and output token counts."""
    levels = []
    for c in sorted(bare):
        b, p = bare[c], platform[c]
        levels.append(
            {
                "concurrency": c,
                "bare": b,
                "platform": p,
                "overhead_ratio": _ratio(p["tpot_ms"], b["tpot_ms"]),
                "throughput_ratio": _ratio(p["tokens_per_s"], b["tokens_per_s"]),
                "same_tokens": (b["output_tokens"], b["prompt_tokens"])
                == (p["output_tokens"], p["prompt_tokens"]),
            }
        )
    return levels


def verdict(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's target: <= 5% overhead at the lowest concurrency (per token and in
    throughput), and platform throughput at each level relative to the lowest."""
    first = levels[0]
    over, thr = first["overhead_ratio"], first["throughput_ratio"]
    met = over is not None and thr is not None
    met = met and over <= 1 + TARGET_OVERHEAD and thr >= 1 / (1 + TARGET_OVERHEAD)
    base = first["platform"]["tokens_per_s"]
    return {
        "max_overhead": TARGET_OVERHEAD,
        "at_concurrency": first["concurrency"],
        "met": bool(met),
        "platform_throughput_scaling": {
            str(lv["concurrency"]): _ratio(lv["platform"]["tokens_per_s"], base) for lv in levels
        },
    }


def fmt_number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(levels: list[dict[str, Any]]) -> str:
    head = (
        "| concurrency | bare tok/s | platform tok/s | throughput ratio | bare TPOT ms "
        "| platform TPOT ms | overhead ratio | bare TTFT ms | platform TTFT ms | same tokens |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for lv in levels:
        b, p = lv["bare"], lv["platform"]
        f = fmt_number
        cells = [lv["concurrency"], f(b["tokens_per_s"], 1), f(p["tokens_per_s"], 1)]
        cells += [f(lv["throughput_ratio"], 3), f(b["tpot_ms"], 2), f(p["tpot_ms"], 2)]
        cells += [f(lv["overhead_ratio"], 3), f(b["ttft_ms"], 1), f(p["ttft_ms"], 1)]
        cells.append("yes" if lv["same_tokens"] else "**no**")
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return head + "\n".join(rows) + "\n"

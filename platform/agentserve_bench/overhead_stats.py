"""Load generation and figures for `agentserve bench overhead`: one request's timing, a
concurrency level's statistics, ratios between systems, the verdict and the table."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from agentserve.autoscale.latency_stat import nearest_rank
from agentserve.autoscale.latency_stat import tpot_ms as tpot_of

__all__ = [
    "TARGET_OVERHEAD",
    "TARGET_THROUGHPUT",
    "OneRequest",
    "RequestTiming",
    "compare_systems",
    "fmt_number",
    "level_stats",
    "markdown_table",
    "run_level",
    "verdict",
]

TARGET_OVERHEAD = 0.05  # issue 15: TPOT within 1.05x of the reference at the lowest level
TARGET_THROUGHPUT = 0.9  # issue 15: at least 0.9x the reference's tokens/s at the highest


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
        return tpot_of(self.first_s, self.last_s, self.output_tokens)


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
        "tpot_ms_p50": _round(nearest_rank(tpot, 0.5)),
        "tpot_ms_p95": _round(nearest_rank(tpot, 0.95)),
        "ttft_ms": _round(np.mean(ttft)) if ttft else None,
        "ttft_ms_p50": _round(nearest_rank(ttft, 0.5)),
        "ttft_ms_p95": _round(nearest_rank(ttft, 0.95)),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def compare_systems(
    systems: dict[str, dict[int, dict[str, Any]]], reference: str
) -> list[dict[str, Any]]:
    """Per concurrency: each system's figures, its tpot_ratio (mean TPOT / the reference's)
    and throughput_ratio (tokens/s / the reference's), and same_tokens: whether it
    generated the prompt and output token counts of the first system (the bare engine)."""
    first = next(iter(systems.values()))
    levels = []
    for c in sorted(first):
        figures = {name: by_level[c] for name, by_level in systems.items()}
        ref, base = figures[reference], figures[next(iter(figures))]
        counts = (base["output_tokens"], base["prompt_tokens"])
        levels.append(
            {
                "concurrency": c,
                "systems": figures,
                "tpot_ratio": {n: _ratio(f["tpot_ms"], ref["tpot_ms"]) for n, f in figures.items()},
                "throughput_ratio": {
                    n: _ratio(f["tokens_per_s"], ref["tokens_per_s"]) for n, f in figures.items()
                },
                "same_tokens": {
                    n: (f["output_tokens"], f["prompt_tokens"]) == counts
                    for n, f in figures.items()
                },
            }
        )
    return levels


def verdict(levels: list[dict[str, Any]], reference: str, system: str) -> dict[str, Any]:
    """Issue 15's targets for `system` against `reference`: mean TPOT within
    1 + TARGET_OVERHEAD at the lowest concurrency, throughput at least TARGET_THROUGHPUT at
    the highest; and `system`'s throughput at each level relative to the lowest."""
    low, high = levels[0], levels[-1]
    tpot, thr = low["tpot_ratio"][system], high["throughput_ratio"][system]
    met = tpot is not None and thr is not None
    met = met and tpot <= 1 + TARGET_OVERHEAD and thr >= TARGET_THROUGHPUT
    base = low["systems"][system]["tokens_per_s"]
    return {
        "system": system,
        "reference": reference,
        "max_tpot_ratio": 1 + TARGET_OVERHEAD,
        "min_throughput_ratio": TARGET_THROUGHPUT,
        "tpot_ratio_at_lowest": tpot,
        "throughput_ratio_at_highest": thr,
        "met": bool(met),
        "throughput_scaling": {
            str(lv["concurrency"]): _ratio(lv["systems"][system]["tokens_per_s"], base)
            for lv in levels
        },
    }


def fmt_number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(levels: list[dict[str, Any]], reference: str) -> str:
    """One row per concurrency and system; ratios are to `reference`."""
    head = (
        f"| concurrency | system | tok/s | tok/s vs {reference} | TPOT ms (mean) | TPOT p50 "
        f"| TPOT p95 | TPOT vs {reference} | TTFT p50 | TTFT p95 | same tokens |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    f = fmt_number
    for lv in levels:
        for name, s in lv["systems"].items():
            cells = [lv["concurrency"], name, f(s["tokens_per_s"], 1)]
            cells += [f(lv["throughput_ratio"][name], 3), f(s["tpot_ms"], 2)]
            cells += [f(s["tpot_ms_p50"], 2), f(s["tpot_ms_p95"], 2)]
            cells += [f(lv["tpot_ratio"][name], 3), f(s["ttft_ms_p50"], 1), f(s["ttft_ms_p95"], 1)]
            cells.append("yes" if lv["same_tokens"][name] else "**no**")
            rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return head + "\n".join(rows) + "\n"

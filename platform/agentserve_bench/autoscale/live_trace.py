"""The live autoscaling run's pure parts: a short two-tenant trace (trace.py's generator,
scaled down to minutes and to what one CPU core serves), the prompt each call sends,
and the per-phase report from the request records (attainment, percentiles, replicas).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from agentserve.autoscale.latency_stat import nearest_rank  # re-exported: the one percentile

from agentserve_bench.autoscale.trace import (
    Call,
    Session,
    TenantClass,
    Trace,
    TraceConfig,
    generate_trace,
)

__all__ = [
    "Record",
    "attained",
    "generate_live",
    "in_burst",
    "live_sessions",
    "live_trace_config",
    "nearest_rank",
    "phase_report",
    "prompt_text",
    "replica_seconds",
    "scaled_up_and_down",
    "tenant_report",
]

BURST_START, BURST_END = 2 / 7, 4 / 7  # of the trace: 60-120 s of 210 s
_WORDS = (
    "agent", "tool", "result", "plan", "file", "search", "query", "answer", "code", "test",
    "error", "retry", "context", "summary", "user", "request", "table", "value", "list",
    "step", "check", "report", "update", "record", "window", "model", "token", "batch",
)  # fmt: skip


@dataclass(frozen=True)
class Record:
    """One request as the client saw it; `arrival_s` from the phase's replay start."""

    tenant: str
    session: int
    arrival_s: float
    status: int
    ttft_ms: float | None
    tpot_ms: float | None
    output_tokens: int
    in_burst: bool
    error: str | None = None


def live_trace_config(duration_s: float = 210.0, rate_scale: float = 1.0, seed: int = 7):
    """trace.py's two tenants at minutes scale, flat rate (no diurnal ramp), the
    interactive tenant 3x through the burst (the second and third sevenths of the trace).
    Sizes fit one CPU core of the bundled model: interactive 1-3 calls of ~100 prompt /
    32 output tokens; batch 3-6 calls of ~200 / 128. `rate_scale` multiplies both
    tenants' session rates (20 and 3 sessions a minute)."""
    classes = (
        TenantClass("interactive", 20.0 * rate_scale, (1, 3), 100, 32, 1.0, burst=True),
        TenantClass("batch", 3.0 * rate_scale, (3, 6), 200, 128, 0.5, burst=False),
    )
    return TraceConfig(
        seed=seed,
        duration_s=duration_s,
        diurnal_low=1.0,
        burst_start_s=round(duration_s * BURST_START, 3),
        burst_s=round(duration_s * (BURST_END - BURST_START), 3),
        burst_factor=3.0,
        classes=classes,
    )


def live_sessions(
    trace: Trace, max_prompt_tokens: int, max_output_tokens: int
) -> tuple[Session, ...]:
    """The trace's sessions with each call's prompt and output capped (the live model's
    context is short; the simulator's sessions grow their context, these do not)."""

    def capped(c: Call) -> Call:
        prompt = min(c.prompt_tokens, max_prompt_tokens)
        output = min(c.output_tokens, max_output_tokens)
        return replace(c, prompt_tokens=prompt, output_tokens=output, new_tokens=prompt)

    return tuple(replace(s, calls=tuple(capped(c) for c in s.calls)) for s in trace.sessions)


def generate_live(cfg: TraceConfig, max_prompt_tokens: int, max_output_tokens: int):
    return live_sessions(generate_trace(cfg), max_prompt_tokens, max_output_tokens)


def prompt_text(session: int, call: int, tokens: int) -> str:
    """About `tokens` words (~1 token each), distinct per session and call from the first
    words on, so the prefix cache does not serve one prompt for all."""
    head = f"Session {session} call {call}:"
    n = max(1, tokens - 4)
    return " ".join([head, *(_WORDS[(session * 7 + call * 3 + i) % len(_WORDS)] for i in range(n))])


def in_burst(cfg: TraceConfig, arrival_s: float) -> bool:
    return cfg.burst_start_s <= arrival_s < cfg.burst_start_s + cfg.burst_s


def attained(record: Record, ttft_ms: float, tpot_ms: float) -> bool:
    """Served (200, no stream error) within both objectives; TPOT counts only when the
    request produced two tokens or more."""
    if record.status != 200 or record.error is not None or record.ttft_ms is None:
        return False
    return record.ttft_ms <= ttft_ms and (record.tpot_ms is None or record.tpot_ms <= tpot_ms)


def _share(flags: list[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def tenant_report(records: Sequence[Record], ttft_ms: float, tpot_ms: float) -> dict:
    """Attainment (all, outside and in the burst), status counts, TTFT/TPOT p50/p95 of the
    served requests."""
    ok = [attained(r, ttft_ms, tpot_ms) for r in records]
    served = [r for r in records if r.status == 200 and r.ttft_ms is not None]
    ttfts = [r.ttft_ms for r in served if r.ttft_ms is not None]
    tpots = [r.tpot_ms for r in served if r.tpot_ms is not None]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    return {
        "requests": len(records),
        "statuses": dict(sorted(statuses.items())),
        "stream_errors": sum(r.error is not None for r in records),
        "attainment": _share(ok),
        "attainment_outside_burst": _share(
            [o for r, o in zip(records, ok, strict=True) if not r.in_burst]
        ),
        "attainment_in_burst": _share([o for r, o in zip(records, ok, strict=True) if r.in_burst]),
        "ttft_p50_ms": _ms(nearest_rank(ttfts, 0.5)),
        "ttft_p95_ms": _ms(nearest_rank(ttfts, 0.95)),
        "tpot_p50_ms": _ms(nearest_rank(tpots, 0.5)),
        "tpot_p95_ms": _ms(nearest_rank(tpots, 0.95)),
    }


def scaled_up_and_down(timeline: Sequence[dict]) -> bool:
    """Whether RUNNING replicas went 1 -> 2 -> 1 (in that order) over the timeline."""
    stage = 0  # 0: waiting for 1, 1: for 2, 2: for 1 again
    for point in timeline:
        running = point["running"]
        if (stage, running) in ((0, 1), (1, 2), (2, 1)):
            stage += 1
    return stage == 3


def scale_up_s(timeline: Sequence[dict]) -> float | None:
    """Seconds from the first point with a STARTING replica (Ray starts it right after the
    policy's decision) to the first point with more RUNNING replicas than before it: a
    scale-up replica's start, to within the timeline's polling step. None without one."""
    before = None
    for point in timeline:
        if before is None and point.get("states", {}).get("STARTING"):
            before = point
        elif before is not None and point["running"] > before["running"]:
            return round(point["t_s"] - before["t_s"], 1)
    return None


def replica_seconds(timeline: Sequence[dict], end_s: float) -> float:
    """Running replicas integrated over time, from the first point to `end_s`."""
    total = 0.0
    for point, after in zip(timeline, [*timeline[1:], {"t_s": end_s}], strict=False):
        total += point["running"] * max(0.0, min(after["t_s"], end_s) - point["t_s"])
    return total


def phase_report(records: Sequence[Record], slas: dict[str, tuple[float, float]]) -> dict:
    """Per tenant (name -> (TTFT ms, TPOT ms) objectives): tenant_report."""
    return {
        name: tenant_report([r for r in records if r.tenant == name], ttft, tpot)
        for name, (ttft, tpot) in slas.items()
    }

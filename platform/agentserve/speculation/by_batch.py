"""Speculative-decoding counters by running batch size: how DFlash acceptance changes as
the batch grows (the autoscaler's speculation schedule depends on it).

`SpecByBatch` accumulates per verify step (drafts, drafted tokens, accepted tokens) under
the number of requests running in that step. The fake engine feeds it directly; with vLLM,
`vllm_stat_logger(acc)` is a stat-logger factory for AsyncLLM that feeds it from every
step's SchedulerStats (num_running_reqs, spec_decoding_stats). `batch_bucket` groups batch
sizes for export (1, 2, 3-4, 5-8, ...), keeping label and key counts small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SpecByBatch", "acceptance_by_bucket", "batch_bucket", "bucket_counts", "counts_delta"]
__all__ += ["vllm_stat_logger"]

BatchCounts = tuple[int, int, int, int]
"""(batch size, drafts, drafted tokens, accepted tokens); counters since start."""


class SpecByBatch:
    """Cumulative spec-decode counters keyed by running batch size (not thread-safe:
    fed from the engine's event loop)."""

    def __init__(self) -> None:
        self._counts: dict[int, list[int]] = {}

    def add(self, batch: int, drafts: int, draft_tokens: int, accepted: int) -> None:
        """One step (or several at the same batch size); steps without drafts are ignored."""
        if drafts <= 0:
            return
        row = self._counts.setdefault(max(1, batch), [0, 0, 0])
        row[0] += drafts
        row[1] += draft_tokens
        row[2] += accepted

    def snapshot(self) -> tuple[BatchCounts, ...]:
        """Counters sorted by batch size (EngineStats.spec_by_batch)."""
        return tuple((b, *row) for b, row in sorted(self._counts.items()))  # type: ignore[misc]


def batch_bucket(batch: int) -> str:
    """Power-of-two bucket label: 1, 2, 3-4, 5-8, 9-16, ..."""
    if batch <= 2:
        return str(max(1, batch))
    high = 1 << (batch - 1).bit_length()
    return f"{high // 2 + 1}-{high}"


def bucket_counts(rows: Iterable[BatchCounts]) -> dict[str, tuple[int, int, int]]:
    """(drafts, drafted, accepted) summed per batch bucket, buckets in batch order."""
    out: dict[str, list[int]] = {}
    for batch, drafts, drafted, accepted in sorted(rows):
        row = out.setdefault(batch_bucket(batch), [0, 0, 0])
        row[0] += drafts
        row[1] += drafted
        row[2] += accepted
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def acceptance_by_bucket(rows: Iterable[BatchCounts]) -> dict[str, float]:
    """Mean acceptance length (1 + accepted / drafts) per batch bucket with drafts."""
    return {k: 1.0 + a / d for k, (d, _, a) in bucket_counts(rows).items() if d > 0}


def counts_delta(now: Iterable[BatchCounts], then: Iterable[BatchCounts]) -> list[BatchCounts]:
    """Counters accumulated between two snapshots (`then` older), per batch size."""
    old = {b: (d, t, a) for b, d, t, a in then}
    out = []
    for b, d, t, a in now:
        d0, t0, a0 = old.get(b, (0, 0, 0))
        if d > d0:
            out.append((b, d - d0, t - t0, a - a0))
    return out


def vllm_stat_logger(
    acc: SpecByBatch, on_step: Callable[[int, int], None] | None = None
) -> Callable[[Any, int], Any]:
    """A vLLM per-engine stat-logger factory (AsyncLLM.from_engine_args(stat_loggers=[..]))
    that adds each step's spec-decode stats to `acc` under that step's running batch, and
    calls `on_step(running, waiting)` for every step the engine reports (its progress).
    Imports vLLM when called."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SpecByBatchLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if on_step is not None and scheduler_stats is not None:
                on_step(scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs)
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is None:
                return
            batch = scheduler_stats.num_running_reqs or spec.num_drafts
            acc.add(batch, spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens)

        def log_engine_initialized(self) -> None:
            pass

    return _SpecByBatchLogger

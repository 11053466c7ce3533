"""What one request's delta stream has carried so far: first-output time, token counts,
engine steps and finish reason; the one bookkeeping of a stream of engine deltas.

Used by the ingress's admitted call (admission/shares.py: TTFT, usage, metrics), mid-stream
migration (serve/migrate.py: what was passed on), the replica's spans (serve/spans.py:
prefill/decode and speculation figures) and its autoscaling windows
(serve/replica_stats.py: TTFT and TPOT samples).

Contracts: counts follow Delta's (cumulative; a lower count never lowers them). The first
output is the first visible delta (Delta.visible: output, or an empty answer's finish).
A step is a delta that added output tokens (one per engine step: a speculative step
delivers several tokens). Times are in whatever clock the caller passes (seconds or ns).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentserve.engine.protocol import Delta

__all__ = ["DeltaTracker"]


@dataclass(kw_only=True)
class DeltaTracker:
    """Fed each delta in order (`see` with its arrival time, or `tally` untimed)."""

    first: float | None = None  # arrival of the first visible delta
    last: float | None = None  # arrival of the latest delta
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, served by the prefix cache
    completion_tokens: int = 0
    steps: int = 0  # deltas that added output tokens
    finish_reason: str | None = None  # the latest choice's
    finish_reasons: dict[int, str] = field(default_factory=dict)  # by choice index

    def see(self, delta: Delta, now: float) -> bool:
        """Count `delta`, which arrived at `now`; True when it is the first visible one."""
        first = self.first is None and delta.visible
        if first:
            self.first = now
        self.last = now
        self.tally(delta)
        return first

    def tally(self, delta: Delta) -> int:
        """Count `delta`'s tokens and finish reason (no times); the output tokens it added."""
        added = delta.completion_tokens - self.completion_tokens
        if added > 0:
            self.steps += 1
            self.completion_tokens = delta.completion_tokens
        self.prompt_tokens = max(self.prompt_tokens, delta.prompt_tokens)
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
        self.finish_reason = delta.finish_reason or self.finish_reason
        if delta.finish_reason:
            self.finish_reasons[delta.index] = delta.finish_reason
        return max(0, added)

    def ttft(self, start: float) -> float | None:
        """Time from `start` to the first visible delta (None: none yet)."""
        return None if self.first is None else self.first - start

    def decode_time(self) -> float | None:
        """Time from the first visible delta to the latest delta (None: none yet)."""
        if self.first is None or self.last is None:
            return None
        return self.last - self.first

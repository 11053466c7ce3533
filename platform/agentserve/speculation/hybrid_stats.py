"""Reading what a hybrid engine reports (speculation/hybrid_drafter.py writes it): counts per
proposer, per request, and its drafting steps with and without DFlash's block forward."""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["proposer_rows", "read_stats", "request_counts", "step_rows"]


def read_stats(path: str | os.PathLike[str], key: str = "proposers") -> dict[str, Any] | None:
    """The per-proposer counts an engine wrote (key "steps": its drafting steps with and
    without DFlash's block forward), or None when there are none (yet)."""
    try:
        with open(path) as f:
            return json.load(f)[key]
    except (OSError, ValueError, KeyError):
        return None


def request_counts(
    path: str | os.PathLike[str], request_id: str
) -> dict[str, dict[str, int]] | None:
    """One request's per-proposer counts from a stats file, or None when the file has none.
    vLLM's engine knows a request by the id its serving layer gave it (agentserve's id with
    a "chatcmpl-"/"cmpl-" prefix) and "-" with 8 random characters after it."""
    try:
        with open(path) as f:
            requests = json.load(f).get("requests") or {}
    except (OSError, ValueError, AttributeError):
        return None
    for internal, counts in requests.items():
        if internal.rpartition("-")[0].endswith(request_id):
            return counts
    return None


def proposer_rows(path: str | None) -> tuple[tuple[str, int, int, int], ...]:
    """EngineStats.spec_by_proposer from a stats file: (proposer, drafts, drafted tokens,
    accepted tokens) per proposer; () without a file or before the first report."""
    stats = read_stats(path) if path else None
    if not stats:
        return ()
    return tuple(
        (p, int(c["drafts"]), int(c["drafted_tokens"]), int(c["accepted_tokens"]))
        for p, c in sorted(stats.items())
    )


def step_rows(path: str | None) -> tuple[tuple[str, int], ...]:
    """EngineStats.spec_steps from a stats file: (kind, steps) for "block" and
    "context_only"; () without a file or before the first report."""
    steps = read_stats(path, "steps") if path else None
    return tuple((kind, int(n)) for kind, n in sorted(steps.items())) if steps else ()

"""The embedded default on a kind of CPU that has no served figures: calibrate, then choose.

Where `agentserve bench speculative-served` has measured this kind of CPU (its profile's
`speculation`), its figures decide the bundled model's speculation. Anywhere else,
`agentserve up` times this machine's step costs (engine/step_costs.py: seconds, cached per
machine and model) and `speculation.choice.choose` picks dtype, method and k from them with
each method's measured acceptance (the pooled profile's), scaled by what the served
benchmark showed vLLM's whole step adds (its served factors). `--speculation`
and the spec's own drafter and dtype settings still win.

The decision is also exported to the ingress (AGENTSERVE_SPECULATION_DECISIONS, read by
serve/metrics.py) so /metrics shows what was chosen and why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentserve.speculation.choice import Choice, choose_served, drafter_fraction

__all__ = [
    "DECISIONS_ENV",
    "calibrated_choice",
    "decisions_from_env",
    "export_decisions",
]

DECISIONS_ENV = "AGENTSERVE_SPECULATION_DECISIONS"


def calibrated_choice(
    model_dir: Path,
    drafter_dir: Path | None,
    cache_root: Path,
    progress: Callable[[str], None] | None = None,
) -> tuple[Choice, dict[str, Any], bool]:
    """(choice, profile, was_cached) for the model at `model_dir` on this machine; DFlash is
    a candidate only when `drafter_dir` (a shipped drafter) is given."""
    from agentserve.engine.step_costs import cached_profile, measure_profile
    from agentserve.speculation.schedule import method_acceptance

    profile, cached = cached_profile(
        model_dir, cache_root, lambda: measure_profile(model_dir, progress=progress)
    )
    measured = method_acceptance()
    acceptance = {"ngram": measured["ngram"]}
    fractions = {"ngram": 0.0}
    fraction = drafter_fraction(drafter_dir)
    if fraction is not None:
        acceptance["dflash"] = measured["dflash"]
        fractions["dflash"] = fraction
    choice = choose_served(profile, acceptance, fractions)
    return choice, profile, cached


def export_decisions(decisions: dict[str, dict[str, Any]]) -> None:
    """Put {model: decision} where the ingress's metrics find it (this process's env, which
    the local Ray cluster's workers inherit)."""
    os.environ[DECISIONS_ENV] = json.dumps(decisions, separators=(",", ":"))


def decisions_from_env() -> dict[str, dict[str, Any]]:
    """{model: {"decided_by", "method", "k", "dtype", "predicted_speedup"}} or {}."""
    try:
        data = json.loads(os.environ.get(DECISIONS_ENV) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}

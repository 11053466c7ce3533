"""Defaults decided from a DeploymentSpec before it is served: the speculative method of each
model whose spec leaves it open, and the drafted tokens by batch size of each drafter left at
`speculation_schedule: auto` (autoscale/spec_schedule.py `with_default_schedules`).

It lives beside spec.py, not in the CLI, so that everything that turns a spec into a
deployment (`agentserve up`, the benchmarks) resolves the same spec to the same models.
The Kubernetes operator applies the schedule default (`with_default_schedules`, in
resource.desired_from_cr) but not the method default (today): a CR's drafter is deployed as
written, so the bundled model with `drafter.enabled` unset runs without speculation there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentserve.autoscale.spec_schedule import with_default_schedules
from agentserve.drafters import (
    default_speculation,
    default_speculation_reason,
    default_speculation_tokens,
    shipped_drafter,
)
from agentserve.spec import BUNDLED_MODEL, DRAFTERLESS_METHODS, DeploymentSpec, spec_from_dict

__all__ = ["resolve_drafters", "with_default_drafters", "with_default_schedules"]


def with_default_drafters(
    spec: DeploymentSpec,
    flag: bool | None,
    shipped: Callable[[str], Path | None],
    default_method: Callable[[str], str | None] = lambda _: "dflash",
    why_default: Callable[[str], str] = lambda _: "no default speculative method for it",
    default_tokens: Callable[[str], int | None] = lambda _: None,
) -> tuple[DeploymentSpec, list[str]]:
    """Decide each model's speculation; return the spec and notes for the user.

    flag True/False (--drafter/--no-drafter) switches drafting on/off for every model.
    flag None: a vLLM model of the bundled source whose spec leaves `drafter.enabled`
    unset speculates with `default_method(source)` (the measured-fastest method; the spec's
    `drafter.method` wins when set), drafting at most `default_tokens(source)` tokens where
    the spec leaves num_speculative_tokens unset; dflash needs `shipped(source)`.
    """
    data = spec.model_dump(mode="json")
    notes = []
    for model, entry in zip(spec.models, data["models"], strict=True):
        if flag is not None:
            entry["drafter"]["enabled"] = flag
            continue
        explicit = "enabled" in model.drafter.model_fields_set
        if explicit or model.engine != "vllm" or model.source != BUNDLED_MODEL:
            continue
        chosen = "method" in model.drafter.model_fields_set
        method = model.drafter.method if chosen else default_method(model.source)
        entry["drafter"]["enabled"] = method is not None
        if method is None:
            notes.append(
                f"model {model.name}: no speculative decoding: {why_default(model.source)}"
            )
            continue
        entry["drafter"]["method"] = method
        tokens = None if chosen else default_tokens(model.source)
        if tokens and "num_speculative_tokens" not in model.drafter.model_fields_set:
            entry["drafter"]["num_speculative_tokens"] = tokens  # the measured k
        if method in DRAFTERLESS_METHODS:
            if not chosen and shipped(model.source) is not None:
                notes.append(
                    f"model {model.name}: speculating with {method}, measured faster than "
                    "its shipped DFlash drafter (docs/benchmarks.md); `--speculation dflash` "
                    "drafts with DFlash instead"
                )
            continue
        if method == "dflash" and model.drafter.path is None and shipped(model.source) is None:
            entry["drafter"]["enabled"] = False
            notes.append(
                f"model {model.name}: no shipped DFlash drafter installed; serving without "
                "speculative decoding (train one with `agentserve train-drafter`)"
            )
    resolved = spec_from_dict(data, source="(with drafter defaults)")
    return with_default_schedules(resolved), notes


def resolve_drafters(
    spec: DeploymentSpec, flag: bool | None = None
) -> tuple[DeploymentSpec, list[str]]:
    """`with_default_drafters` with the shipped drafters and the measured default methods
    (agentserve.drafters): the spec as `agentserve up` serves it, and notes for the user."""
    return with_default_drafters(
        spec,
        flag,
        shipped_drafter,
        default_speculation,
        default_speculation_reason,
        default_speculation_tokens,
    )

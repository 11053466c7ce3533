"""Defaults decided from a DeploymentSpec before it is served: the speculative method of each
model whose spec leaves it open, and the drafted tokens by batch size of each drafter left at
`speculation_schedule: auto` (speculation/schedule.py `with_default_schedules`); on GPU
replicas the catalog's DFlash drafter and the model's own context length
(spec/device_defaults.py), and on `up` with CUDA visible, GPU replicas where the spec leaves
replicas.num_gpus unset.

It lives beside spec/, not in the CLI, so that everything that turns a spec into a
deployment (`agentserve up`, the benchmarks) resolves the same spec to the same models.
The Kubernetes operator applies the same rule (resource.desired_from_cr calls
`resolve_drafters` with the kind of machine its replicas run on, and no calibration).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from agentserve.drafters import (
    default_dtype,
    default_speculation,
    default_speculation_reason,
    default_speculation_tokens,
    has_served_speculation,
    machine_class,
    shipped_drafter,
)
from agentserve.spec import (
    BUNDLED_MODEL,
    DFLASH_METHODS,
    DRAFTERLESS_METHODS,
    DeploymentSpec,
    spec_from_dict,
)
from agentserve.spec.device_defaults import with_catalog_drafters, with_context_lengths, with_gpus
from agentserve.spec.drafter import tokens_for_block
from agentserve.speculation.choice import Choice
from agentserve.speculation.schedule import with_default_schedules
from dflash.config import DFlashConfig

__all__ = [
    "resolve_drafters",
    "with_default_drafters",
    "with_default_dtype",
    "with_default_schedules",
    "with_device_defaults",
]


def with_default_drafters(
    spec: DeploymentSpec,
    flag: bool | None,
    shipped: Callable[[str], Path | None],
    default_method: Callable[[str], str | None] = lambda _: "dflash",
    why_default: Callable[[str], str] = lambda _: "no default speculative method for it",
    default_tokens: Callable[[str], int | None] = lambda _: None,
    default_dtype: Callable[[str], str | None] = lambda _: None,
    machine: str | None = None,
) -> tuple[DeploymentSpec, list[str]]:
    """Decide each model's speculation; return the spec and notes for the user.

    flag True/False (--drafter/--no-drafter) switches drafting on/off for every model.
    flag None: a vLLM model of the bundled source whose spec leaves `drafter.enabled`
    unset speculates with `default_method(source)` (the measured-fastest method; the spec's
    `drafter.method` wins when set), drafting at most `default_tokens(source)` tokens where
    the spec leaves num_speculative_tokens unset, in `default_dtype(source)` where the spec
    leaves dtype unset (None: the spec's); dflash needs `shipped(source)`. The schedules
    come from the latency model of `machine` (the replicas' kind; None: this machine).
    """
    data = spec.model_dump(mode="json")
    notes = []
    for model, entry in zip(spec.models, data["models"], strict=True):
        if model.task == "embed":  # an embedding model never drafts
            continue
        if flag is not None:
            entry["drafter"]["enabled"] = flag
            continue
        explicit = "enabled" in model.drafter.model_fields_set
        if explicit or model.engine != "vllm" or model.source != BUNDLED_MODEL:
            continue
        chosen = "method" in model.drafter.model_fields_set
        method = model.drafter.method if chosen else default_method(model.source)
        dtype = None if chosen else default_dtype(model.source)
        if dtype and "dtype" not in model.model_fields_set:
            entry["dtype"] = dtype
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
        if (
            method in DFLASH_METHODS
            and model.drafter.path is None
            and shipped(model.source) is None
        ):
            entry["drafter"]["enabled"] = False
            notes.append(
                f"model {model.name}: no shipped DFlash drafter installed; serving without "
                "speculative decoding (train one with `agentserve train-drafter`)"
            )
    for model, entry in zip(spec.models, data["models"], strict=True):
        _fit_tokens_to_block(model, entry, shipped)
    resolved = spec_from_dict(data, source="(with drafter defaults)")
    return with_default_schedules(resolved, machine), notes


def _fit_tokens_to_block(model, entry: dict, shipped: Callable[[str], Path | None]) -> None:
    """A DFlash or hybrid drafter whose spec leaves num_speculative_tokens unset drafts at
    most what its block holds (block_size - 1): a drafter trained for a CPU's small blocks
    serves under `--speculation dflash` instead of being refused for the spec's default k.
    A k the spec sets is kept (and refused later if the block cannot hold it)."""
    drafter = entry["drafter"]
    if not drafter.get("enabled") or drafter.get("method") not in DFLASH_METHODS:
        return
    if model.engine != "vllm":
        return
    path = Path(drafter["path"]) if drafter.get("path") else shipped(model.source)
    if path is None or not (path / "config.json").is_file():
        return  # a hub drafter: its config is read (and k checked) where it is downloaded
    try:
        most = DFlashConfig.load(path).num_draft_tokens
    except (ValueError, KeyError):
        return  # refused by field when the engine's arguments are built
    drafter["num_speculative_tokens"] = tokens_for_block(
        drafter["num_speculative_tokens"],
        "num_speculative_tokens" in model.drafter.model_fields_set,
        most,
    )


def resolve_drafters(
    spec: DeploymentSpec,
    flag: bool | None = None,
    progress: Callable[[str], None] | None = None,
    decisions: dict[str, dict] | None = None,
    machine: str | None = None,
) -> tuple[DeploymentSpec, list[str]]:
    """`with_default_drafters` with the shipped drafters and the default methods: measured
    through the server for this kind of machine (agentserve.drafters), else calibrated on
    this machine (agentserve.speculation.calibration; `progress` hears about a first
    measurement). The spec as `agentserve up` serves it, and notes for the user;
    `decisions` (when given) receives {model: how its speculation was decided} for the metrics.

    `machine`: the kind of machine the replicas run on (a cpu_class or "cuda"), when it is
    not this one: the operator passes it, and no calibration runs (this machine's step
    costs say nothing about the replicas')."""
    here = machine is None
    machine = machine or machine_class()
    if here and machine == "cuda":
        spec = with_gpus(spec)  # `up` on a GPU machine: GPU replicas where the spec leaves it
    spec, device_notes, catalogued = with_device_defaults(spec, flag)
    choice = _calibrate(spec, flag, machine, progress) if here else None
    if choice is None:
        dtype = default_dtype(BUNDLED_MODEL, machine)
        typed = with_default_dtype(spec, dtype)
        resolved, notes = with_default_drafters(
            typed,
            flag,
            shipped_drafter,
            lambda source: default_speculation(source, machine),
            lambda source: default_speculation_reason(source, machine),
            lambda source: default_speculation_tokens(source, machine),
            machine=None if here else machine,
        )
        notes = [
            f"model {after.name}: served in {dtype}, measured faster than {before.dtype} "
            f"through the server on this kind of machine ({machine}); set the model's dtype "
            "to choose another"
            for after, before in zip(typed.models, spec.models, strict=True)
            if after.dtype != before.dtype
        ] + notes
        decided_by = "served figures" if _measured(machine) else "no figures"
    else:
        resolved, notes = with_default_drafters(
            spec,
            flag,
            shipped_drafter,
            lambda _: choice.method,
            lambda _: f"calibrated on this machine ({machine}): {choice.reason}",
            lambda _: choice.num_speculative_tokens or None,
            lambda _: choice.dtype,
        )  # calibrated here: the schedules come from this machine's (cached) step costs
        if choice.method is not None:
            notes.append(f"speculation calibrated on this machine ({machine}): {choice.reason}")
        decided_by = "calibration"
    if decisions is not None:
        for model, before in zip(resolved.models, spec.models, strict=True):
            by_default = flag is None and "enabled" not in before.drafter.model_fields_set
            decided = "drafter catalog" if model.name in catalogued else decided_by
            decisions[model.name] = {
                "decided_by": decided if by_default or model.name in catalogued else "spec",
                "method": model.drafter.method if model.drafter.enabled else "none",
                "k": model.drafter.num_speculative_tokens if model.drafter.enabled else 0,
                "dtype": model.dtype,
                "machine": machine,
                "predicted_speedup": choice.predicted_speedup if choice and by_default else None,
            }
    return resolved, device_notes + notes


def with_device_defaults(
    spec: DeploymentSpec, flag: bool | None
) -> tuple[DeploymentSpec, list[str], set[str]]:
    """The model-dependent device defaults of GPU models (agentserve.spec.device_defaults): the
    catalog's DFlash drafter, then the model's own context length. Returns the spec, notes
    for the user and the names of the models whose drafter the catalog decided."""
    spec, drafter_notes, catalogued = with_catalog_drafters(spec, flag)
    spec, context_notes = with_context_lengths(spec)
    return spec, drafter_notes + context_notes, catalogued


def with_default_dtype(spec: DeploymentSpec, dtype: str | None) -> DeploymentSpec:
    """`spec` with the bundled model served on CPU in `dtype` (the one measured fastest
    through the server on the replicas' kind of CPU, its machine profile)
    where its spec leaves dtype unset, speculating or not (`--no-drafter` included, so the
    two compare like for like); None, or a spec that sets dtype, keeps the spec's."""
    if dtype is None:
        return spec
    models = [
        model.model_copy(update={"dtype": dtype})
        if model.engine == "vllm"
        and model.source == BUNDLED_MODEL
        and model.replicas.num_gpus == 0
        and "dtype" not in model.model_fields_set
        else model
        for model in spec.models
    ]  # model_copy keeps which fields the spec set (the later defaults read them)
    return spec.model_copy(update={"models": models})


def _measured(machine: str) -> bool:
    return has_served_speculation(BUNDLED_MODEL, machine)


def _calibrate(spec, flag, machine, progress) -> Choice | None:
    """The calibrated choice where this kind of CPU has no served figures and the default
    decides a bundled model's speculation on CPU; None otherwise (or AGENTSERVE_CALIBRATE=0)."""
    if flag is not None or machine == "cuda" or _measured(machine):
        return None
    if os.environ.get("AGENTSERVE_CALIBRATE", "1") == "0":
        return None
    if not any(
        m.engine == "vllm"
        and m.source == BUNDLED_MODEL
        and m.replicas.num_gpus == 0
        and "enabled" not in m.drafter.model_fields_set
        for m in spec.models
    ):
        return None
    return _calibrate_choice(machine, progress)


def _calibrate_choice(machine: str, progress: Callable[[str], None] | None) -> Choice:
    """This machine's calibrated choice for the bundled model (cached per machine)."""
    from agentserve.sources.models import cache_root, resolve_model
    from agentserve.speculation.calibration import calibrated_choice

    model_dir = resolve_model(BUNDLED_MODEL, progress=progress is not None)
    if progress:
        progress(f"timing step costs on this machine ({machine}, no served figures for it)")
    choice, _, _ = calibrated_choice(
        model_dir, shipped_drafter(BUNDLED_MODEL), cache_root(), progress
    )
    return choice

"""Fill DrafterSpec.num_speculative_tokens_per_batch_size from the latency model.

`with_speculation_schedule(spec)` returns a copy of the spec in which every model with
an enabled drafter (or only `model_name`) carries `speculation_schedule(latency_model,
max_num_seqs, num_speculative_tokens)`: the drafted-token count minimising modelled time
per output token at each batch size. `agentserve spec speculation-schedule FILE` prints
the result as YAML.

`with_default_schedules(spec)` is the default every deployment path applies (`agentserve
up` through spec.defaults.resolve_drafters, the operator through desired_from_cr): each
enabled drafter left at `speculation_schedule: auto` without a schedule gets the one its
model's measured latency model chooses (`latency_model_for`), so a saturated replica stops
paying for drafts that cost more than they return. The latency model is the one of the
machine the replicas run on: derived from its calibrated step costs where there are some
(autoscale/calibrated_model.py), else the whole-engine fit (LatencyModel()). Models without a
measured latency model keep drafting the fixed k: a schedule from another machine's fit
would be a guess.
"""

from __future__ import annotations

import dataclasses

from agentserve import profiles
from agentserve.autoscale.calibrated_model import calibrated_latency_model
from agentserve.autoscale.model import (
    LatencyModel,
    speculation_schedule,
)
from agentserve.spec import (
    BUNDLED_MODEL,
    DFLASH_METHODS,
    DeploymentSpec,
    DrafterSpec,
    ModelNotInSpecError,
    ModelSpec,
)

__all__ = [
    "latency_model_for",
    "measured_acceptance",
    "method_acceptance",
    "method_draft_rate",
    "schedule_for",
    "with_default_schedules",
    "with_speculation_schedule",
]


def method_acceptance() -> dict[str, tuple[float, float]]:
    """{method: (alpha at batch 1, drop per doubling of the batch)} of each speculative
    method on the bundled model, measured through the server (agentserve_bench/served_fits.py over
    every kind of machine's agentserve rows, the pooled profile's `acceptance`); a method
    not listed keeps LatencyModel's assumption."""
    measured = profiles.section(profiles.POOLED, "acceptance") or {}
    return {m: (a.alpha_1, a.drop_per_doubling) for m, a in measured.items()}


def method_draft_rate() -> dict[str, float]:
    """{method: the share of a sequence's decode steps that carried a draft} through the
    server at concurrency 1 (agentserve_bench/served_fits.py, the pooled profile's `draft_rate`):
    prompt lookup drafts only where the context repeats, a drafter on every step."""
    return dict(profiles.section(profiles.POOLED, "draft_rate") or {})


def latency_model_for(model: ModelSpec, machine: str | None = None) -> LatencyModel | None:
    """The latency model measured for this model on the machine its replicas run on
    (`machine`: its kind, a cpu_class or "cuda"; None = this machine), with the measured
    acceptance of its drafter's method (method_acceptance): for the bundled model with
    vLLM, the one derived from that machine's calibrated step costs where there are some
    (calibrated_model.calibrated_latency_model), else on CPU LatencyModel() (fitted on the
    bundled model with vLLM on CPU); None for anything else until a model is fitted or
    calibrated for it. A model's own `latency_model` (measured by `agentserve bench
    fit-latency`) comes first, with its acceptance, else its method's measured one for
    the bundled model. The SLA policy plans with it and the default speculation schedule
    comes from it."""
    drafting = model.drafter.enabled and model.drafter.method in DFLASH_METHODS
    if model.latency_model is not None:
        return _from_spec(model, drafting)
    if model.engine != "vllm" or model.source != BUNDLED_MODEL:
        return None
    method = model.drafter.method
    acceptance = method_acceptance().get(method) if model.drafter.enabled else None
    base = LatencyModel(drafter_every_step=drafting)
    if acceptance is not None:
        base = dataclasses.replace(
            base,
            alpha_1=acceptance[0],
            alpha_drop_per_doubling=acceptance[1],
            draft_rate=method_draft_rate().get(method, 1.0),
        )
    calibrated = calibrated_latency_model(model, base, machine)
    if calibrated is not None:
        return calibrated
    return base if model.replicas.num_gpus == 0 else None


def _from_spec(model: ModelSpec, drafting: bool) -> LatencyModel:
    """The LatencyModel of a model's own `latency_model` section."""
    own = model.latency_model
    assert own is not None
    # no measured acceptance: plan as if no draft were accepted (tau 1): the step costs were
    # measured without drafting, and a guessed acceptance would make every TPOT optimistic
    acceptance = measured_acceptance(model) or (0.0, 0.0)
    return LatencyModel(
        base_ms=own.base_ms,
        knee_tokens=own.knee_tokens,
        per_token_ms=own.per_token_ms,
        prefill_ms_per_token=own.prefill_ms_per_token,
        alpha_1=acceptance[0],
        alpha_drop_per_doubling=acceptance[1],
        speculative_step_factor=own.speculative_step_factor,
        drafter_every_step=drafting,
    )


def measured_acceptance(model: ModelSpec) -> tuple[float, float] | None:
    """(alpha at batch 1, drop per doubling) measured for the model's drafter: its own
    latency_model's, else its method's for the bundled model (method_acceptance); None
    without a drafter or a measurement."""
    if not model.drafter.enabled:
        return None
    own = model.latency_model
    if own is not None and own.alpha_1 is not None:
        drop = own.alpha_drop_per_doubling
        return own.alpha_1, LatencyModel().alpha_drop_per_doubling if drop is None else drop
    if model.source == BUNDLED_MODEL:
        return method_acceptance().get(model.drafter.method)
    return None


def schedule_for(model: ModelSpec, latency_model: LatencyModel) -> list[list[int]]:
    """The per-batch schedule for one model's drafter, as spec data ([[start, end, k]])."""
    ranges = speculation_schedule(
        latency_model, model.engine_slots, model.drafter.num_speculative_tokens
    )
    return [list(r) for r in ranges]


def with_speculation_schedule(
    spec: DeploymentSpec,
    latency_model: LatencyModel | None = None,
    model_name: str | None = None,
) -> DeploymentSpec:
    """A validated copy of `spec` with the schedule set on each drafter-enabled model
    (only `model_name` when given; ModelNotInSpecError, a KeyError, when it is not served or
    has no drafter). `latency_model` defaults to each model's own (latency_model_for: its
    `latency_model` section, the bundled model's measured one), else LatencyModel() (fitted
    on the bundled CPU model)."""
    chosen = [m for m in spec.models if m.drafter.enabled and model_name in (None, m.name)]
    if model_name is not None and not chosen:
        raise ModelNotInSpecError(
            f"model {model_name!r} is not in the spec or has no enabled drafter"
        )
    data = spec.model_dump(mode="json")
    for i, model in enumerate(spec.models):
        if model in chosen:
            drafter = data["models"][i]["drafter"]
            own = latency_model or latency_model_for(model) or LatencyModel()
            drafter["num_speculative_tokens_per_batch_size"] = schedule_for(model, own)
    return DeploymentSpec.model_validate(data)


def with_default_schedules(spec: DeploymentSpec, machine: str | None = None) -> DeploymentSpec:
    """`spec` with the default schedule filled on each model whose drafter is enabled,
    `speculation_schedule: auto`, has no explicit num_speculative_tokens_per_batch_size and
    has a measured latency model on `machine` (see latency_model_for; a model's own
    latency_model only with its acceptance); `spec` itself (unchanged) when no model
    qualifies."""
    models = []
    for model in spec.models:
        drafter, latency = model.drafter, latency_model_for(model, machine)
        wanted = drafter.enabled and drafter.speculation_schedule == "auto"
        if model.latency_model is not None and measured_acceptance(model) is None:
            wanted = False  # the model's own step costs, but its acceptance a guess
        if wanted and latency is not None and drafter.num_speculative_tokens_per_batch_size is None:
            data = drafter.model_dump() | {
                "num_speculative_tokens_per_batch_size": schedule_for(model, latency)
            }
            # the drafter alone is re-validated: the spec's own validation context (tenants
            # given apart) is not known here, and nothing outside the drafter changes
            model = model.model_copy(update={"drafter": DrafterSpec.model_validate(data)})
        models.append(model)
    if all(new is old for new, old in zip(models, spec.models, strict=True)):
        return spec
    return spec.model_copy(update={"models": models})

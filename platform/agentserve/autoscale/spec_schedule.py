"""Fill DrafterSpec.num_speculative_tokens_per_batch_size from the latency model.

`with_speculation_schedule(spec)` returns a copy of the spec in which every model with
an enabled drafter (or only `model_name`) carries `speculation_schedule(latency_model,
max_num_seqs, num_speculative_tokens)`: the drafted-token count minimising modelled time
per output token at each batch size. `agentserve spec speculation-schedule FILE` prints
the result as YAML.

`with_default_schedules(spec)` is the default every deployment path applies (`agentserve
up` through spec_defaults.resolve_drafters, the operator through desired_from_cr): each
enabled drafter left at `speculation_schedule: auto` without a schedule gets the one its
model's measured latency model chooses (`latency_model_for`), so a saturated replica stops
paying for drafts that cost more than they return. Models without a measured latency model
keep drafting the fixed k: a schedule from another machine's fit would be a guess.
"""

from __future__ import annotations

from agentserve.autoscale.model import LatencyModel, speculation_schedule
from agentserve.spec import (
    BUNDLED_MODEL,
    DeploymentSpec,
    DrafterSpec,
    ModelNotInSpecError,
    ModelSpec,
)

__all__ = [
    "latency_model_for",
    "schedule_for",
    "with_default_schedules",
    "with_speculation_schedule",
]


def latency_model_for(model: ModelSpec) -> LatencyModel | None:
    """The latency model measured for this model: LatencyModel() (fitted on the bundled
    model with vLLM on CPU) for that deployment; None for anything else until a model is
    fitted for it (autoscale/model.py `fit`). The SLA policy plans with it and the default
    speculation schedule comes from it."""
    measured = model.engine == "vllm" and model.source == BUNDLED_MODEL
    return LatencyModel() if measured and model.replicas.num_gpus == 0 else None


def schedule_for(model: ModelSpec, latency_model: LatencyModel) -> list[list[int]]:
    """The per-batch schedule for one model's drafter, as spec data ([[start, end, k]])."""
    ranges = speculation_schedule(
        latency_model, model.max_num_seqs, model.drafter.num_speculative_tokens
    )
    return [list(r) for r in ranges]


def with_speculation_schedule(
    spec: DeploymentSpec,
    latency_model: LatencyModel | None = None,
    model_name: str | None = None,
) -> DeploymentSpec:
    """A validated copy of `spec` with the schedule set on each drafter-enabled model
    (only `model_name` when given; ModelNotInSpecError, a KeyError, when it is not served or
    has no drafter). `latency_model` defaults to LatencyModel() (fitted on the bundled CPU
    model)."""
    latency_model = latency_model or LatencyModel()
    chosen = [m for m in spec.models if m.drafter.enabled and model_name in (None, m.name)]
    if model_name is not None and not chosen:
        raise ModelNotInSpecError(
            f"model {model_name!r} is not in the spec or has no enabled drafter"
        )
    data = spec.model_dump(mode="json")
    for i, model in enumerate(spec.models):
        if model in chosen:
            drafter = data["models"][i]["drafter"]
            drafter["num_speculative_tokens_per_batch_size"] = schedule_for(model, latency_model)
    return DeploymentSpec.model_validate(data)


def with_default_schedules(spec: DeploymentSpec) -> DeploymentSpec:
    """`spec` with the default schedule filled on each model whose drafter is enabled,
    `speculation_schedule: auto`, has no explicit num_speculative_tokens_per_batch_size and
    has a measured latency model; `spec` itself (unchanged) when no model qualifies."""
    models = []
    for model in spec.models:
        drafter, latency = model.drafter, latency_model_for(model)
        wanted = drafter.enabled and drafter.speculation_schedule == "auto"
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

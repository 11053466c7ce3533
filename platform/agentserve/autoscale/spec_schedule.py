"""Fill DrafterSpec.num_speculative_tokens_per_batch_size from the latency model.

`with_speculation_schedule(spec)` returns a copy of the spec in which every model with
an enabled drafter (or only `model_name`) carries `speculation_schedule(latency_model,
max_num_seqs, num_speculative_tokens)`: the drafted-token count minimising modelled time
per output token at each batch size. `agentserve spec speculation-schedule FILE` prints
the result as YAML.
"""

from __future__ import annotations

from agentserve.autoscale.model import LatencyModel, speculation_schedule
from agentserve.spec import DeploymentSpec, ModelNotInSpecError, ModelSpec

__all__ = ["schedule_for", "with_speculation_schedule"]


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

"""Which model and LoRA adapter a request's `model` names (pure; spec `models[].lora`).

As vLLM's server reads it: a model's own name selects its base weights, an adapter's name
selects that adapter (adapter names are unique across a deployment: spec/deployment.py);
agentserve also reads `<model>:<adapter>`. The ingress rewrites the body's `model` to the
base model's name, so queues, limits, metrics and replicas are the base model's, and
keeps the adapter beside it (admission/admit.py); the engine body names the adapter again
(serve/engine_request.py), which is how vLLM's serving layer picks its LoRARequest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentserve.api.errors import ModelNotFoundError
from agentserve.spec import ModelSpec

__all__ = ["ModelNames"]


class ModelNames:
    """The served names of a deployment's models and their adapters."""

    def __init__(self, models: Iterable[ModelSpec]):
        self.bases: list[str] = []  # the models' names
        self.adapters: dict[str, tuple[str, str]] = {}  # served name -> (model, adapter)
        self.parents: dict[str, str] = {}  # adapter -> its model, in spec order
        for model in models:
            self.bases.append(model.name)
            for adapter in model.lora.adapters if model.lora else ():
                self.parents[adapter] = model.name
                self.adapters[adapter] = (model.name, adapter)
                self.adapters[f"{model.name}:{adapter}"] = (model.name, adapter)

    def resolve(self, requested: str) -> tuple[str, str | None]:
        """(model, adapter or None) for a request's `model`. A name that is neither a
        model nor an adapter comes back as is (admission refuses it: 404), except
        `<model>:<name>` of a served model with no adapter `name`: ModelNotFoundError."""
        if requested in self.bases:
            return requested, None
        if requested in self.adapters:
            return self.adapters[requested]
        model, sep, _ = requested.rpartition(":")
        if sep and model in self.bases:
            raise ModelNotFoundError(requested, self.served())
        return requested, None

    def rewrite(self, data: Any) -> tuple[Any, str | None]:
        """(`data` with its `model` the base model's, the adapter it named or None); a body
        that is not an object or whose model is not a string is left to validation."""
        if not self.adapters or not isinstance(data, dict):
            return data, None
        requested = data.get("model")
        if not isinstance(requested, str):
            return data, None
        model, adapter = self.resolve(requested)
        return ({**data, "model": model} if model != requested else data), adapter

    def served(self) -> list[str]:
        """Every name a request may give: the models, then the adapters."""
        return [*self.bases, *self.parents]

"""LoRA adapter weights: each adapter a model's spec names (`lora.adapters`) as a local PEFT
directory, the way the model's own source is resolved.

A Hugging Face id is resolved by agentserve.sources.hub.resolve_hub (downloaded once into the hub
cache; HF_HUB_OFFLINE=1 reads only the cache); a local path must be a directory holding
adapter_config.json. `check_local_adapters` checks the local ones without touching the
network, so `agentserve up` refuses a wrong path before Ray starts; the engine resolves
them all when it starts (engine/vllm_args.py).
"""

from __future__ import annotations

from pathlib import Path

from agentserve.sources.errors import ModelNotFoundError
from agentserve.sources.models import is_hub_id
from agentserve.spec import DeploymentSpec, ModelSpec

__all__ = ["ADAPTER_CONFIG", "AdapterMissingError", "adapter_dirs", "check_local_adapters"]

ADAPTER_CONFIG = "adapter_config.json"  # PEFT's: what marks a LoRA adapter directory


class AdapterMissingError(ValueError):
    """An adapter the spec names has no weights where it says."""


def adapter_dirs(model: ModelSpec) -> dict[str, Path]:
    """Adapter name -> its local directory, for every adapter of `model` (none: {}).
    Hub ids are downloaded once into the cache; AdapterMissingError names the adapter
    that cannot be found."""
    if model.lora is None:
        return {}
    return {
        name: _adapter_dir(model.name, name, source) for name, source in model.lora.adapters.items()
    }


def check_local_adapters(spec: DeploymentSpec) -> None:
    """AdapterMissingError for the first adapter given as a local path that is not a PEFT
    directory (Hugging Face ids are left to the engine's start: they may need a download)."""
    for model in spec.models:
        for name, source in (model.lora.adapters if model.lora else {}).items():
            if not is_hub_id(source):
                _local_dir(model.name, name, source)


def _adapter_dir(model: str, name: str, source: str) -> Path:
    if not is_hub_id(source) or Path(source).is_dir():  # an existing ./org/name wins
        return _local_dir(model, name, source)
    from agentserve.sources.hub import resolve_hub  # lazy: huggingface_hub, hub ids only

    try:
        path = resolve_hub(source, None, progress=False)
    except ModelNotFoundError as err:
        raise AdapterMissingError(f"model {model!r}: lora.adapters.{name}: {err}") from None
    if not (path / ADAPTER_CONFIG).is_file():
        raise AdapterMissingError(
            f"model {model!r}: lora.adapters.{name}: {source!r} has no {ADAPTER_CONFIG} "
            "(not a PEFT LoRA adapter)"
        )
    return path


def _local_dir(model: str, name: str, source: str) -> Path:
    path = Path(source).expanduser()
    if path.is_dir() and (path / ADAPTER_CONFIG).is_file():
        return path.resolve()
    reason = "has no " + ADAPTER_CONFIG if path.is_dir() else "is not a directory"
    raise AdapterMissingError(
        f"model {model!r}: lora.adapters.{name}: {source!r} {reason}; give a PEFT LoRA "
        "adapter directory (adapter_config.json and adapter_model.safetensors) or a Hugging "
        "Face id (ORG/NAME)"
    )

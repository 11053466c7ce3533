"""A model's LoRA adapters (spec `lora`) as vLLM takes them: engine arguments (enable_lora,
max_loras, max_lora_rank) and the frontend's static `lora_modules`, which vLLM's serving
layer loads at start (a bad adapter fails the start) and selects per request by the
body's `model` (its LoRARequest for that adapter: serve/engine_request.py sets the name).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentserve.spec import ModelSpec

__all__ = ["lora_kwargs", "lora_modules"]


def lora_kwargs(model: ModelSpec) -> dict[str, Any]:
    """AsyncEngineArgs keywords for the model's adapters; {} without any."""
    lora = model.lora
    if lora is None:
        return {}
    return {
        "enable_lora": True,
        "max_loras": min(lora.max_loras, len(lora.adapters)),  # no buffers for none
        "max_lora_rank": lora.max_lora_rank,
    }


def lora_modules(model: ModelSpec, dirs: Mapping[str, Path]) -> list[Any] | None:
    """vLLM's LoRAModulePath per adapter (`dirs`: name -> local directory, as
    agentserve.sources.adapters.adapter_dirs resolves them), parent the model; None without any."""
    if not dirs:
        return None
    from vllm.entrypoints.openai.models.protocol import LoRAModulePath

    return [
        LoRAModulePath(name=name, path=str(path), base_model_name=model.name)
        for name, path in dirs.items()
    ]

"""LoraSpec: the LoRA adapters one model serves beside its base weights (vLLM multi-LoRA).

A request selects an adapter by its `model`: the adapter's name, or `<base>:<adapter>`
(admission/adapter_names.py); /v1/models lists each adapter with its base as `parent`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from agentserve.sources.models import is_hub_id, is_local_path
from agentserve.spec.base import _Spec

ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""An adapter's name: no ":" (it separates base and adapter in a request's model) nor "/"."""


class LoraSpec(_Spec):
    """LoRA adapters of one model: vLLM loads them beside the base weights (enable_lora)."""

    adapters: dict[str, str] = Field(
        ...,
        min_length=1,
        max_length=256,
        description="Adapter name -> its weights: a Hugging Face id (ORG/NAME: downloaded "
        "once into the hub cache, as the model's source is; HF_HUB_OFFLINE=1 reads only "
        "the cache) or a local PEFT directory with adapter_config.json (absolute or "
        "./relative). A request's `model` selects one by its name or as <model>:<name>.",
    )
    max_lora_rank: Literal[8, 16, 32, 64, 128, 256, 320, 512] = Field(
        16,
        description="Largest rank (r) of the adapters (one of vLLM's max_lora_rank "
        "values): vLLM sizes its LoRA buffers for it and refuses an adapter of a higher "
        "rank when it loads.",
    )
    max_loras: int = Field(
        1,
        ge=1,
        le=256,
        description="Adapters an engine batch holds at once (vLLM's max_loras: device "
        "memory for that many, capped at the number of adapters); requests for a further "
        "adapter wait until one is free.",
    )

    @field_validator("adapters")
    @classmethod
    def _check_adapters(cls, adapters: dict[str, str]) -> dict[str, str]:
        for name, source in adapters.items():
            if len(name) > 128 or not re.fullmatch(ADAPTER_NAME_PATTERN, name):
                raise ValueError(
                    f"adapter name {name!r}: letters, digits, '.', '_' and '-' (no ':' "
                    "or '/', which a request's model uses), at most 128"
                )
            if not (is_local_path(source) or is_hub_id(source)):
                raise ValueError(
                    f"adapters.{name}: {source!r} is neither a Hugging Face id (ORG/NAME) "
                    "nor a local directory (an absolute path or one starting with ./)"
                )
        return adapters

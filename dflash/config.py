"""DFlashConfig: drafter shape and conditioning, in the config.json format vLLM's `dflash` loads."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DFlashConfig", "default_target_layer_ids"]

# vLLM maps this architecture name to its Qwen3-style DFlash drafter (qwen3_dflash.py).
VLLM_ARCHITECTURE = "DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_features: int = 4) -> list[int]:
    """Spread `num_features` taps evenly from layer 1 to layer L-2 (0-based).

    For a 30-layer target and 4 features: [1, 10, 19, 28]. The last layer is left out:
    its output is shaped for the LM head, the middle of the stack carries more future.
    """
    if num_target_layers < 3:
        return list(range(num_target_layers))
    first, last = 1, num_target_layers - 2
    if num_features == 1:
        return [last]
    step = (last - first) / (num_features - 1)
    return sorted({round(first + i * step) for i in range(num_features)})


def _refuse_unsupported(data: dict[str, Any]) -> None:
    sliding = [t for t in data.get("layer_types") or [] if t != "full_attention"]
    if sliding or (data.get("use_sliding_window") and data.get("sliding_window")):
        raise ValueError(
            f"drafter config layer_types {data.get('layer_types')} / sliding_window: "
            "sliding-window drafter layers are not supported (full_attention only)"
        )
    for rope in (data.get("rope_parameters") or {}, data.get("rope_scaling") or {}):
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind in (None, "default"):
            continue
        raise ValueError(
            f"drafter config rope_parameters/rope_scaling rope_type {kind!r}: scaled RoPE "
            "drafters are not supported (rope_type 'default' only)"
        )
    if not (data.get("dflash_config") or {}).get("target_layer_ids") and not data.get(
        "target_layer_ids"
    ):
        raise ValueError(
            "drafter config has no dflash_config.target_layer_ids: not a DFlash drafter"
        )


@dataclass
class DFlashConfig:
    """Shape of a DFlash drafter and how it is conditioned on its target.

    The drafter shares the target's embeddings, so `hidden_size` and `vocab_size` equal the
    target's. It shares the LM head too unless `draft_vocab_size` is set: then it has its own
    head over that many target tokens (the most frequent ones) and a `d2t` map back to target
    ids, the format vLLM's drafters read (8K rows instead of 49K cut drafting cost ~4x).
    `target_layer_ids` are 0-based target layers whose outputs (the residual stream after
    that layer) are concatenated as context features.
    A block is [last verified token, mask x (block_size - 1)]; one forward pass drafts
    block_size - 1 tokens.
    """

    hidden_size: int
    vocab_size: int
    num_target_layers: int
    mask_token_id: int
    target_layer_ids: list[int] = field(default_factory=list)
    block_size: int = 16
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1536
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_position_embeddings: int = 8192
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if not self.target_layer_ids:
            self.target_layer_ids = default_target_layer_ids(self.num_target_layers)
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside vocab {self.vocab_size}")
        ids = self.target_layer_ids
        if ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= self.num_target_layers:
            raise ValueError(
                f"target_layer_ids must be increasing, unique, in [0, {self.num_target_layers}):"
                f" got {ids}"
            )
        if self.draft_vocab_size is not None and not (
            self.block_size <= self.draft_vocab_size <= self.vocab_size
        ):
            raise ValueError(
                f"draft_vocab_size must be in [{self.block_size}, {self.vocab_size}],"
                f" got {self.draft_vocab_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def num_draft_tokens(self) -> int:
        return self.block_size - 1

    @classmethod
    def for_target(cls, target_config: Any, mask_token_id: int, **overrides: Any) -> DFlashConfig:
        """A drafter config sized for a HF target config (LlamaConfig, Qwen3Config, ...)."""
        rope = getattr(target_config, "rope_parameters", None) or {}
        base = dict(
            hidden_size=target_config.hidden_size,
            vocab_size=target_config.vocab_size,
            num_target_layers=target_config.num_hidden_layers,
            mask_token_id=mask_token_id,
            num_attention_heads=target_config.num_attention_heads,
            num_key_value_heads=target_config.num_key_value_heads,
            head_dim=getattr(target_config, "head_dim", None)
            or target_config.hidden_size // target_config.num_attention_heads,
            intermediate_size=target_config.intermediate_size,
            rms_norm_eps=target_config.rms_norm_eps,
            rope_theta=rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0)),
        )
        base.update(overrides)
        return cls(**base)

    # -- vLLM / z-lab checkpoint format -----------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """config.json for vLLM's `dflash` method (a Qwen3 config plus dflash_config)."""
        data = {
            "architectures": [VLLM_ARCHITECTURE],
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},  # hf_remote_code.py
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "use_sliding_window": False,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "torch_dtype": "bfloat16",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
        }
        if self.draft_vocab_size is not None:
            data["draft_vocab_size"] = self.draft_vocab_size
        return data

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> DFlashConfig:
        """Read a DFlash config.json (ours, or a published z-lab checkpoint's).

        Raises ValueError naming the field for shapes this drafter does not implement
        (sliding-window layers, scaled RoPE) rather than loading them wrongly."""
        dflash = data.get("dflash_config") or {}
        rope = data.get("rope_parameters") or {}
        _refuse_unsupported(data)
        num_heads = data["num_attention_heads"]
        return cls(
            hidden_size=data["hidden_size"],
            vocab_size=data["vocab_size"],
            num_target_layers=data.get("num_target_layers", max(dflash["target_layer_ids"]) + 2),
            mask_token_id=dflash.get("mask_token_id", data.get("mask_token_id")),
            target_layer_ids=dflash.get("target_layer_ids", data.get("target_layer_ids")),
            block_size=data.get("block_size", 16),
            num_hidden_layers=data["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=data.get("num_key_value_heads", num_heads),
            head_dim=data.get("head_dim") or data["hidden_size"] // num_heads,
            intermediate_size=data["intermediate_size"],
            rms_norm_eps=data.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", data.get("rope_theta", 1_000_000.0)),
            max_position_embeddings=data.get("max_position_embeddings", 8192),
            draft_vocab_size=(
                None
                if data.get("draft_vocab_size") in (None, data["vocab_size"])
                else data["draft_vocab_size"]
            ),
        )

    @classmethod
    def load(cls, directory: str | Path) -> DFlashConfig:
        return cls.from_hf_dict(json.loads((Path(directory) / "config.json").read_text()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

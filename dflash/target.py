"""Run a HF decoder-only target (Llama/Qwen2/Qwen3 family) with a per-sequence KV cache.

The reference loop needs what `model.generate` does not give: several tokens per step at
per-sequence positions, hidden states from chosen layers, and a cache whose length is
committed per sequence after verification (rejected positions are simply not committed:
they stay masked and are overwritten next step, so trimming is exact and free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash.layers import apply_rope, rope_cos_sin

__all__ = ["KVCache", "TargetModel", "TargetOutput", "load_target"]


@dataclass
class KVCache:
    """Per-layer keys/values [B, kv_heads, capacity, head_dim] and committed lengths [B]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor  # [B] int64: slots [0, length) hold committed tokens

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [B, kv_heads, S, D] at slots positions [B, S] (uncommitted until advance)."""
        if int(positions.max()) >= self.capacity:
            raise ValueError(f"KV cache full: position {int(positions.max())} >= {self.capacity}")
        index = positions[:, None, :, None].expand_as(k)
        self.keys[layer].scatter_(2, index, k)
        self.values[layer].scatter_(2, index, v)

    def advance(self, num_tokens: torch.Tensor) -> None:
        """Commit the first num_tokens [B] written slots of each sequence."""
        self.lengths += num_tokens

    def keep(self, rows: torch.Tensor) -> None:
        """Drop finished sequences: keep batch rows `rows` (in that order)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.lengths = self.lengths.index_select(0, rows)


@dataclass
class TargetOutput:
    logits: torch.Tensor | None  # [B, S, V] float32 (None when stopped early)
    features: torch.Tensor | None  # [B, S, len(layer_ids) * H]: residual stream after each layer


class TargetModel(nn.Module):
    """Wraps a loaded HF causal LM; reuses its weights, replaces the attention plumbing."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model
        self.config = hf_model.config
        inner = hf_model.model
        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.lm_head = hf_model.lm_head
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.num_heads = self.config.num_attention_heads
        self.num_kv_heads = self.config.num_key_value_heads
        self.scaling = attn.scaling
        rope_type = (getattr(self.config, "rope_parameters", None) or {}).get(
            "rope_type", "default"
        )
        if rope_type not in ("default", "llama3", "linear"):
            raise NotImplementedError(
                f"rope_type {rope_type!r} is not supported by the reference loop"
            )
        self.register_buffer(
            "inv_freq", inner.rotary_emb.inv_freq.float().clone(), persistent=False
        )
        self.rope_scaling = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        shape = (batch_size, self.num_kv_heads, capacity, self.head_dim)
        device = self.embed_tokens.weight.device
        return KVCache(
            keys=[torch.zeros(shape, dtype=self.dtype, device=device) for _ in self.layers],
            values=[torch.zeros(shape, dtype=self.dtype, device=device) for _ in self.layers],
            lengths=torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [..., H] -> float32 logits [..., V] (the shared LM head)."""
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        feature_layers: list[int] | None = None,
        logits_at: torch.Tensor | None = None,
        stop_after_layer: int | None = None,
    ) -> TargetOutput:
        """Score tokens [B, S] placed right after each sequence's committed length.

        Attention is causal over committed slots plus the new block. The cache is written
        but not advanced: call cache.advance(n) with what was accepted. `logits_at` [B]
        restricts logits to one position per row (prefill), giving [B, 1, V].
        `stop_after_layer` = n runs only layers [0, n) and returns no logits (feature extraction).
        """
        batch, steps = tokens.shape
        positions = cache.lengths[:, None] + torch.arange(steps, device=tokens.device)  # [B, S]
        span = int(positions.max()) + 1
        slots = torch.arange(span, device=tokens.device)
        mask = (slots[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, S, span]
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.rope_scaling)
        wanted = set(feature_layers or [])
        features = []
        x = self.embed(tokens)  # [B, S, H]
        for i, layer in enumerate(self.layers[:stop_after_layer]):
            x = x + self._attention(
                i, layer.self_attn, layer.input_layernorm(x), positions, cos, sin, cache, mask, span
            )
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in wanted:
                features.append(x)
        stacked = torch.cat(features, dim=-1) if features else None
        if stop_after_layer is not None:
            return TargetOutput(logits=None, features=stacked)
        if logits_at is not None:
            x = x[torch.arange(batch, device=x.device), logits_at][:, None]  # [B, 1, H]
        return TargetOutput(logits=self.logits(self.norm(x)), features=stacked)

    def _attention(
        self,
        index: int,
        attn: nn.Module,
        h: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor,
        span: int,
    ) -> torch.Tensor:
        batch, steps, _ = h.shape
        q = attn.q_proj(h).view(batch, steps, self.num_heads, self.head_dim)
        k = attn.k_proj(h).view(batch, steps, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(h).view(batch, steps, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, heads, S, D]
        k = apply_rope(k.transpose(1, 2), cos, sin)
        cache.write(index, positions, k, v.transpose(1, 2))
        keys = cache.keys[index][:, :, :span]
        values = cache.values[index][:, :, :span]
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=True
        )  # [B, heads, S, D]
        return attn.o_proj(out.transpose(1, 2).reshape(batch, steps, -1))


def load_target(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> TargetModel:
    """Load a local HF checkpoint directory as a TargetModel (float32 is fastest on CPU)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return TargetModel(hf)

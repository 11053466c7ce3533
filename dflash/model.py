"""The DFlash drafter: a small Qwen3-style stack that drafts a whole block in one pass.

Parameter names match vLLM's `DFlashDraftModel` (qwen3_dflash.py) exactly, so a
state_dict saved from here loads there unchanged: layers.{i}.self_attn.{q,k,v,o}_proj,
layers.{i}.self_attn.{q,k}_norm, layers.{i}.mlp.{gate,up,down}_proj,
layers.{i}.{input,post_attention}_layernorm, fc, hidden_norm, norm. Embeddings and the
LM head are the target's and are not part of the drafter.

Conditioning: target features (several layers' outputs, concatenated) -> fc ->
hidden_norm give one context vector per verified position; every drafter layer projects
it with its own k_proj/v_proj (+ k_norm, RoPE at the context position) into extra keys and
values. The block's queries attend to all context keys and bidirectionally to the block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash.config import DFlashConfig
from dflash.layers import MLP, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq

__all__ = ["ContextKV", "DFlashDrafter"]

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: k, v [B, kv_heads, C, D]


class DrafterAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)
        return apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def context_kv(
        self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Context vectors [B, C, H] -> this layer's keys/values [B, kv_heads, C, D]."""
        return self._kv(ctx, cos, sin)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """x [B, S, H] (normed) attends to [context ; block] under mask [B, 1, S, C + S]."""
        batch, steps, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, steps, self.num_heads, self.head_dim))
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k, v = self._kv(x, cos, sin)
        keys = torch.cat([context[0], k], dim=2)
        values = torch.cat([context[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, steps, -1))


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DrafterAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, context, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """Block drafter. Use: project_context -> context_kv (cacheable) -> forward -> logits."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(
            len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False
        )
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer(
            "inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False
        )

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self.inv_freq, positions)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated target features [B, C, n_layers * H] -> context vectors [B, C, H]."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        """Context vectors [B, C, H] at positions [B, C] -> per-layer keys/values."""
        cos, sin = self.rope(positions)
        return [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers]

    def forward(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        context: ContextKV,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """block_embeds [B, S, H] at positions [B, S] -> final-normed hidden [B, S, H].

        mask [B, 1, S, C + S] (bool, True = visible) over [context keys ; block keys].
        """
        cos, sin = self.rope(positions)
        x = block_embeds.to(self.fc.weight.dtype)
        for layer, ctx in zip(self.layers, context, strict=True):
            x = layer(x, cos, sin, ctx, mask)
        return self.norm(x)

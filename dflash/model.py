"""The DFlash drafter: a small Qwen3-style stack that drafts a whole block in one pass.

Parameter names match vLLM's `DFlashDraftModel` (qwen3_dflash.py) exactly, so a
state_dict saved from here loads there unchanged: layers.{i}.self_attn.{q,k,v,o}_proj,
layers.{i}.self_attn.{q,k}_norm, layers.{i}.mlp.{gate,up,down}_proj,
layers.{i}.{input,post_attention}_layernorm, fc, hidden_norm, norm. Embeddings are the
target's. The LM head is the target's too, unless the config sets `draft_vocab_size`: then
the drafter owns `lm_head` [draft_vocab_size, H] and `d2t` (vLLM's offset map: draft id i is
target id i + d2t[i]) and its logits cover only those tokens (-inf elsewhere).

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
        # A separately trained embedding for the mask slots (published `mask_embedding.pt`);
        # None: the target's embedding of mask_token_id.
        self.register_buffer("mask_embedding", None, persistent=False)
        if cfg.draft_vocab_size is not None:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))

    @property
    def own_head(self) -> bool:
        return self.config.draft_vocab_size is not None

    def draft_token_ids(self) -> torch.Tensor:
        """Target token id of each draft-vocabulary row [draft_vocab_size]."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, token_ids: torch.Tensor, target_head: torch.Tensor) -> None:
        """Use these target token ids as the draft vocabulary; copy their target head rows."""
        token_ids = token_ids.sort().values.to(self.d2t.device)
        if len(token_ids) != len(self.d2t) or len(token_ids.unique()) != len(token_ids):
            raise ValueError(f"need {len(self.d2t)} distinct token ids, got {len(token_ids)}")
        with torch.no_grad():
            self.d2t.copy_(token_ids - torch.arange(len(token_ids), device=token_ids.device))
            self.lm_head.weight.copy_(target_head[token_ids.to(target_head.device)])

    def block_embeds(self, block: torch.Tensor, embed: nn.Module) -> torch.Tensor:
        """[last token, mask x K] ids [B, S] -> input embeddings [B, S, H]."""
        x = embed(block)
        if self.mask_embedding is not None:
            x = x.clone()
            x[:, 1:] = self.mask_embedding.to(x.dtype)
        return x

    def logits(self, hidden: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """Final-normed hidden [..., H] -> float logits over the target vocabulary [..., V]."""
        if not self.own_head:
            return target_head(hidden.to(target_head.weight.dtype)).float()
        small = self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()
        full = small.new_full((*small.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.draft_token_ids()] = small
        return full

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

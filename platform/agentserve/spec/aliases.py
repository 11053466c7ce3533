"""vLLM's and Ray Serve LLM's names for model settings, read into ModelSpec's canonical ones.

A model section pasted from a vLLM or Ray Serve LLM config validates: before ModelSpec
checks its fields, `canonical_model_fields` rewrites (pure, on a copy)
  engine_kwargs        (Ray Serve LLM)  -> engine_args; its keys that a ModelSpec field
                       decides (max_model_len, tensor_parallel_size, dtype, ...) -> that field
  speculative_config   (vLLM)           -> drafter: method, model -> path,
                       num_speculative_tokens, prompt_lookup_min/_max, revision,
                       num_speculative_tokens_per_batch_size; enabled (null: off)
  stream_interval      (vLLM)           -> stream_interval_tokens
  model_loading_config (Ray Serve LLM)  -> model_id -> name, model_source -> source
A setting given twice (alias and canonical field, with different values) is refused, as is a
speculative_config key with no drafter equivalent; names no alias covers reach the strict
fields (unknown ones are still refused). The canonical names are the documented form:
the JSON schema (hence the CRD and the Helm values schema) has only them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENGINE_KWARG_FIELDS", "SPECULATIVE_CONFIG_FIELDS", "canonical_model_fields"]

ENGINE_KWARG_FIELDS = {
    name: name
    for name in (
        "max_model_len",
        "max_num_seqs",
        "dtype",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "gpu_memory_utilization",
        "quantization",
        "kv_cache_dtype",
        "max_num_batched_tokens",
        "enable_prefix_caching",
        "async_scheduling",
        "revision",
        "tool_call_parser",
    )
} | {"stream_interval": "stream_interval_tokens", "speculative_config": "drafter"}
"""vLLM engine arguments (in `engine_kwargs`) -> the ModelSpec field that decides them."""

SPECULATIVE_CONFIG_FIELDS = {
    "method": "method",
    "model": "path",
    "num_speculative_tokens": "num_speculative_tokens",
    "prompt_lookup_min": "prompt_lookup_min",
    "prompt_lookup_max": "prompt_lookup_max",
    "revision": "revision",
    "num_speculative_tokens_per_batch_size": "num_speculative_tokens_per_batch_size",
}
"""vLLM speculative_config keys -> DrafterSpec fields."""

MODEL_LOADING_FIELDS = {"model_id": "name", "model_source": "source"}
"""Ray Serve LLM model_loading_config keys -> ModelSpec fields."""


def canonical_model_fields(data: Any) -> Any:
    """`data` (a model section) with the aliases above rewritten to canonical fields; a
    non-dict (pydantic reports it) or a section without aliases is returned as given.
    Raises ValueError for a setting given twice or a key with no equivalent."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    if "model_loading_config" in out:
        loading = _mapping(out.pop("model_loading_config"), "model_loading_config")
        for key, value in loading.items():
            if key not in MODEL_LOADING_FIELDS:
                raise ValueError(f"model_loading_config.{key}: no agentserve equivalent")
            _put(out, MODEL_LOADING_FIELDS[key], value, f"model_loading_config.{key}")
    if "engine_kwargs" in out:
        _merge_engine_kwargs(out, _mapping(out.pop("engine_kwargs"), "engine_kwargs"))
    if "stream_interval" in out:
        _put(out, "stream_interval_tokens", out.pop("stream_interval"), "stream_interval")
    if "speculative_config" in out:
        drafter = drafter_from_speculative_config(out.pop("speculative_config"))
        _put(out, "drafter", drafter, "speculative_config")
    return out


def drafter_from_speculative_config(config: Any) -> dict[str, Any]:
    """A DrafterSpec section for a vLLM speculative_config (None: drafting off)."""
    if config is None:
        return {"enabled": False}
    config = _mapping(config, "speculative_config")
    unknown = sorted(set(config) - set(SPECULATIVE_CONFIG_FIELDS))
    if unknown:
        raise ValueError(
            f"speculative_config.{unknown[0]}: no agentserve drafter equivalent (known: "
            f"{', '.join(SPECULATIVE_CONFIG_FIELDS)}); see `drafter` in the spec schema"
        )
    drafter = {SPECULATIVE_CONFIG_FIELDS[key]: value for key, value in config.items()}
    return {"enabled": True, **drafter}


def _merge_engine_kwargs(out: dict[str, Any], kwargs: Mapping[str, Any]) -> None:
    """Lift the keys a field decides into `out`; the rest joins `out["engine_args"]`."""
    rest: dict[str, Any] = {}
    for key, value in kwargs.items():
        field = ENGINE_KWARG_FIELDS.get(key)
        if field == "drafter":
            _put(out, field, drafter_from_speculative_config(value), f"engine_kwargs.{key}")
        elif field is not None:
            _put(out, field, value, f"engine_kwargs.{key}")
        else:
            rest[key] = value
    args = dict(_mapping(out.get("engine_args", {}), "engine_args"))
    for key, value in rest.items():
        _put(args, key, value, f"engine_kwargs.{key}", where="engine_args.")
    if args:
        out["engine_args"] = args


def _put(out: dict[str, Any], field: str, value: Any, alias: str, where: str = "") -> None:
    """Set out[field] = value, unless it already holds a different value."""
    if field in out and out[field] != value:
        raise ValueError(
            f"{alias} and {where}{field} both set (to {value!r} and {out[field]!r}): "
            f"{alias} is vLLM's or Ray Serve LLM's name for {where}{field}; keep one"
        )
    out[field] = value


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: expected a mapping, got {type(value).__name__}")
    return value

"""Defaults decided by the device a model's replicas run on: GPUs for `agentserve up` on a
machine with CUDA, the model's own context length and the catalog's DFlash drafter on GPU.

ModelSpec fills what the device alone decides (spec/models.py: CPU_ENGINE_DEFAULTS,
GPU_ENGINE_DEFAULTS); what needs the model (its config.json, its published drafter) is
decided here, in spec.defaults.resolve_drafters, which `agentserve up`, the benchmarks and
the operator all call. Nothing here downloads: a Hugging Face model's config is read from
the hub cache only, and a model not cached yet keeps max_model_len null (the engine then
reads the model's own length when it starts).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from agentserve.drafters.catalog import CatalogEntry, catalog_drafter, load_catalog
from agentserve.sources.models import BUNDLED_MODEL, cache_root, is_hub_id
from agentserve.spec import DeploymentSpec, spec_from_dict

__all__ = [
    "model_context_length",
    "source_config",
    "with_catalog_drafters",
    "with_context_lengths",
    "with_gpus",
]


def _unset_dump(spec: DeploymentSpec) -> dict:
    """The spec as the fields it sets (models included), so a re-validation re-applies every
    default: the device's included."""
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["models"] = [m.model_dump(mode="json", exclude_unset=True) for m in spec.models]
    return data


def with_gpus(spec: DeploymentSpec) -> DeploymentSpec:
    """`agentserve up` on a machine with CUDA: every vLLM model whose spec leaves
    replicas.num_gpus unset gets tensor_parallel_size x pipeline_parallel_size GPUs per
    replica, hence the GPU defaults. An explicit num_gpus (0 included) is kept."""
    data, changed = _unset_dump(spec), False
    for model, entry in zip(spec.models, data["models"], strict=True):
        if model.engine != "vllm" or "num_gpus" in model.replicas.model_fields_set:
            continue
        world = model.tensor_parallel_size * model.pipeline_parallel_size
        entry.setdefault("replicas", {})["num_gpus"] = world
        changed = True
    return spec_from_dict(data, source="(GPUs: CUDA is visible)") if changed else spec


def source_config(source: str, revision: str | None = None) -> Path | None:
    """The model's config.json where it can be read without a download: a local directory's,
    the converted bundled model's, or a Hugging Face id's in the hub cache; else None."""
    if source == BUNDLED_MODEL:
        path = cache_root() / "models" / BUNDLED_MODEL / "config.json"
    elif is_hub_id(source) and not Path(source).is_dir():
        from huggingface_hub import try_to_load_from_cache  # lazy: hub ids only

        from agentserve.sources.hub import hub_cache_dir

        found = try_to_load_from_cache(
            source, "config.json", cache_dir=hub_cache_dir(), revision=revision
        )
        path = Path(found) if isinstance(found, str) else None
    else:
        path = Path(source).expanduser() / "config.json"
    return path if path is not None and path.is_file() else None


def model_context_length(model_dir: str | Path) -> int | None:
    """max_position_embeddings of the config.json in `model_dir` (or of its text_config, for
    multimodal checkpoints), or None when unreadable."""
    return _context_of(Path(model_dir) / "config.json")


def _context_of(config_path: Path | None) -> int | None:
    if config_path is None:
        return None
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        value = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(value, int) and value >= 16:
            return value
    return None


def with_context_lengths(
    spec: DeploymentSpec, config_of: Callable[[str, str | None], Path | None] = source_config
) -> tuple[DeploymentSpec, list[str]]:
    """Each vLLM model on GPU replicas whose spec leaves max_model_len null gets the model's
    own context length (`config_of(source, revision)`'s max_position_embeddings); notes say
    where it came from, or that the engine decides it when the config is not here yet."""
    data, notes, changed = _unset_dump(spec), [], False
    for model, entry in zip(spec.models, data["models"], strict=True):
        if model.engine != "vllm" or not model.on_gpu or model.max_model_len is not None:
            continue
        context = _context_of(config_of(model.source, model.revision))
        if context is None:
            notes.append(
                f"model {model.name}: context length: the model's own, read by the engine when "
                "it starts (its config.json is not downloaded yet), fitted to the GPU's memory"
            )
            continue
        entry["max_model_len"], changed = context, True
        notes.append(
            f"model {model.name}: context length {context} tokens (its config.json "
            "max_position_embeddings; on GPU, fitted to the GPU's memory); set max_model_len "
            "(--max-model-len) to choose another"
        )
    if not changed:
        return spec, notes
    return spec_from_dict(data, source="(with context lengths)"), notes


def with_catalog_drafters(
    spec: DeploymentSpec,
    flag: bool | None,
    catalog: dict[str, CatalogEntry] | None = None,
) -> tuple[DeploymentSpec, list[str], set[str]]:
    """Each vLLM model on GPU replicas whose target is in the drafter catalog speculates
    with its published DFlash drafter, where its spec leaves the drafter to the default
    (drafter.enabled unset or true, method unset or dflash, no drafter.path) and `flag`
    (--drafter/--no-drafter) is not False; on CPU replicas only where speculation is asked
    for (flag True, drafter.enabled true): method dflash, path and revision the catalog's,
    num_speculative_tokens block_size - 1 where unset. Returns the spec, notes for the user
    (which drafter and why; for uncatalogued GPU models, why none) and the names of the
    models the catalog decided."""
    catalog = load_catalog() if catalog is None else catalog
    data, notes, decided = _unset_dump(spec), [], set()
    for model, entry in zip(spec.models, data["models"], strict=True):
        drafter = model.drafter
        asked = flag is True or ("enabled" in drafter.model_fields_set and drafter.enabled)
        if model.engine != "vllm" or flag is False or not (model.on_gpu or asked):
            continue  # on CPU only where speculation is asked for (--drafter, enabled: true)
        if "enabled" in drafter.model_fields_set and not drafter.enabled:
            continue  # --speculation none, or the spec's own "off"
        if drafter.path is not None or drafter.method != "dflash":
            continue  # the spec chose a drafter or another method
        found = catalog_drafter(model.source, catalog)
        if found is None:
            if model.source != BUNDLED_MODEL and "enabled" not in drafter.model_fields_set:
                notes.append(_none_note(model.name, model.source))
            continue
        _apply(entry.setdefault("drafter", {}), found)
        if found.trust_remote_code:
            entry.setdefault("engine_args", {}).setdefault("trust_remote_code", True)
        decided.add(model.name)
        notes.append(_catalog_note(model.name, entry["drafter"], found))
    if not decided:
        return spec, notes, decided
    return spec_from_dict(data, source="(with catalog drafters)"), notes, decided


def _apply(drafter: dict, found: CatalogEntry) -> None:
    drafter.update(enabled=True, method="dflash", path=found.drafter, revision=found.revision)
    drafter.setdefault("num_speculative_tokens", found.num_speculative_tokens)


def _catalog_note(name: str, drafter: dict, found: CatalogEntry) -> str:
    note = (
        f"model {name}: speculating with the DFlash drafter {found.drafter} (k="
        f"{drafter['num_speculative_tokens']}, block {found.block_size}), published for "
        f"{found.target} ({found.source}); downloaded with the model; --speculation none "
        "turns it off"
    )
    if found.thinking_off:
        note += (
            "; it was trained with thinking off: send chat_template_kwargs "
            '{"enable_thinking": false} for its full acceptance'
        )
    return note


def _none_note(name: str, source: str) -> str:
    return (
        f"model {name}: no speculative decoding on GPU: no published DFlash drafter for "
        f"{source} in the drafter catalog (agentserve/drafters/catalog.json), and no GPU "
        "measurements to choose n-gram by; --speculation ngram, or drafter.path with "
        "--speculation dflash, turns one on"
    )

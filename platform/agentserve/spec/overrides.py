"""Flag overrides of a DeploymentSpec, re-validated: the model served (`--model`), the server
address and trusted hosts (`--host/--port/--trusted-host`), every vLLM model's dtype and
context length (`--dtype/--max-model-len`) and speculative method (`--speculation`).

It lives beside spec/, not in the CLI, so that `agentserve up` and the benchmarks
(agentserve_bench) override a spec the same way.
"""

from __future__ import annotations

from pathlib import Path

from agentserve.drafters.catalog import catalog_drafter
from agentserve.sources.models import BUNDLED_ALIASES, served_name
from agentserve.spec import (
    BUNDLED_MODEL,
    DFLASH_METHODS,
    DRAFTERLESS_METHODS,
    DeploymentSpec,
    spec_from_dict,
)

__all__ = [
    "served_name",
    "spec_for_model",
    "with_engine_settings",
    "with_overrides",
    "with_speculation",
]


def spec_for_model(source: str | None) -> DeploymentSpec:
    """`agentserve up --model HF_ID|PATH`: the default deployment serving `source` under
    `served_name(source)` instead of the bundled model (None: the default deployment). An
    existing directory is served by its absolute path, so a bare `my-model` dir works."""
    if source is None:
        return DeploymentSpec()
    name = served_name(source)
    path = Path(source).expanduser()
    if source.strip().lower() not in BUNDLED_ALIASES and path.is_dir():
        source = str(path.resolve())
    return spec_from_dict({"models": [{"name": name, "source": source}]}, source="(--model)")


def with_engine_settings(
    spec: DeploymentSpec, dtype: str | None, max_model_len: int | None
) -> DeploymentSpec:
    """`--dtype` / `--max-model-len`: every vLLM model's dtype and context length (None:
    the spec's, or the device's default where the spec leaves it)."""
    if dtype is None and max_model_len is None:
        return spec
    data, vllm_models = _set_fields(spec)
    settings = {"dtype": dtype, "max_model_len": max_model_len}
    settings = {k: v for k, v in settings.items() if v is not None}
    for entry, _ in vllm_models:
        entry.update(settings)
    return spec_from_dict(data, source="(with --dtype/--max-model-len)")


def _set_fields(spec: DeploymentSpec):
    """The spec's data as the user set it (unset stays unset, so defaults are derived
    again) and each vLLM model's entry in it beside its ModelSpec."""
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["models"] = [m.model_dump(mode="json", exclude_unset=True) for m in spec.models]
    pairs = zip(data["models"], spec.models, strict=True)
    return data, [(entry, model) for entry, model in pairs if model.engine == "vllm"]


def with_overrides(
    spec: DeploymentSpec,
    host: str | None,
    port: int | None,
    trusted_hosts: list[str] | None = None,
) -> DeploymentSpec:
    """The spec with server.host/port replaced, `trusted_hosts` added to
    server.trusted_hosts, re-validated (SpecError names the field)."""
    if host is None and port is None and not trusted_hosts:
        return spec
    data = spec.model_dump(mode="json")
    data["server"].update({k: v for k, v in (("host", host), ("port", port)) if v is not None})
    data["server"]["trusted_hosts"] += [h for h in trusted_hosts or [] if h]
    return spec_from_dict(data, source="(with --host/--port/--trusted-host)")


def with_speculation(spec: DeploymentSpec, method: str | None) -> DeploymentSpec:
    """`--speculation METHOD`: every vLLM model drafts with METHOD ("none": no drafting).

    A drafter path in the spec is kept for dflash/eagle3 and dropped for drafterless methods;
    dflash or hybrid on a model without one drafts with the drafter catalog's for its
    target (drafters/catalog.json; its block_size - 1 tokens where the spec sets none).
    """
    if method is None:
        return spec
    data, vllm_models = _set_fields(spec)
    for entry, model in vllm_models:
        drafter = entry.setdefault("drafter", {})
        drafter["enabled"] = method != "none"
        if method != "none":
            drafter["method"] = method
            if method in DRAFTERLESS_METHODS:
                drafter.pop("path", None)
            elif method in DFLASH_METHODS and "path" not in drafter:
                _catalog_path(drafter, model.source)
    return spec_from_dict(data, source=f"(with --speculation {method})")


def _catalog_path(drafter: dict, source: str) -> None:
    found = catalog_drafter(source) if source != BUNDLED_MODEL else None
    if found is not None:
        drafter.update(path=found.drafter, revision=found.revision)
        drafter.setdefault("num_speculative_tokens", found.num_speculative_tokens)

"""Flag overrides of a DeploymentSpec, re-validated: the server address and trusted hosts
(`--host/--port/--trusted-host`) and every vLLM model's speculative method
(`--speculation`).

It lives beside spec/, not in the CLI, so that `agentserve up` and the benchmarks
(agentserve_bench) override a spec the same way.
"""

from __future__ import annotations

from agentserve.spec import DRAFTERLESS_METHODS, DeploymentSpec, spec_from_dict

__all__ = ["with_overrides", "with_speculation"]


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

    A drafter path in the spec is kept for dflash/eagle3 and dropped for drafterless methods.
    """
    if method is None:
        return spec
    data = spec.model_dump(mode="json", exclude_unset=True)  # unset stays unset
    data["models"] = [m.model_dump(mode="json", exclude_unset=True) for m in spec.models]
    for entry, model in zip(data["models"], spec.models, strict=True):
        if model.engine != "vllm":
            continue
        drafter = entry.setdefault("drafter", {})
        drafter["enabled"] = method != "none"
        if method != "none":
            drafter["method"] = method
            if method in DRAFTERLESS_METHODS:
                drafter.pop("path", None)
    return spec_from_dict(data, source=f"(with --speculation {method})")

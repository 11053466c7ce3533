"""Tenants travel apart from the rest of the spec, so rotating a key or changing a quota
updates only the ingress and never restarts a model replica.

Ray Serve restarts every deployment of an application when the application's `args`
change (they are part of its code version); a deployment's `user_config` is a lightweight
update that Serve hands to that deployment's `reconfigure` in place. So the Serve config
carries:
- application `args` = `app_args(spec)`: the spec without tenants, plus each tenant's SLA
  objectives (the model autoscaler plans with them: adding a tenant or changing its SLA
  is still a code change that restarts replicas);
- the ingress deployment's `user_config` = `ingress_user_config(spec)`: the tenants with
  their key hashes, SLAs and limits.
Ray-free: the operator builds the Serve config with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from agentserve.spec import DeploymentSpec, SLASpec, SpecError, TenantSpec, spec_from_dict

__all__ = [
    "TENANTS_FROM_USER_CONFIG",
    "app_args",
    "ingress_user_config",
    "spec_from_app_args",
    "tenants_from_user_config",
]

TENANTS_FROM_USER_CONFIG = "ingress_user_config"


def app_args(spec: DeploymentSpec) -> dict[str, Any]:
    """Serve application args for `spec`: identical for specs that differ only in their
    tenants' keys and limits."""
    return {
        "spec": {**spec.model_dump(mode="json", exclude={"tenants"}), "tenants": []},
        "tenant_slas": {t.name: t.sla.model_dump(mode="json") for t in spec.tenants},
        "tenants_from": TENANTS_FROM_USER_CONFIG,
    }


def ingress_user_config(spec: DeploymentSpec) -> dict[str, Any]:
    """The ingress deployment's user_config: every tenant (key hash, SLA, limits)."""
    return {"tenants": [t.model_dump(mode="json") for t in spec.tenants]}


def spec_from_app_args(args: Mapping[str, Any]) -> tuple[DeploymentSpec, dict[str, SLASpec]]:
    """(spec without tenants, tenant -> SLA) from `app_args` output; SpecError if invalid."""
    spec = spec_from_dict(args["spec"], source="args.spec", tenants_apart=True)
    if spec.tenants:
        raise SpecError("args.spec: tenants belong in the ingress's user_config, not in args")
    raw = args.get("tenant_slas") or {}
    try:
        slas = {str(name): SLASpec.model_validate(sla) for name, sla in raw.items()}
    except ValidationError as err:
        raise SpecError(f"args.tenant_slas: {err}") from None
    return spec, slas


def tenants_from_user_config(config: Any) -> list[TenantSpec]:
    """The tenants of the ingress's user_config ({"tenants": [...]}); SpecError naming the
    first problem (the running ingress then keeps its previous tenants)."""
    if not isinstance(config, Mapping) or not isinstance(config.get("tenants"), list):
        raise SpecError('ingress user_config must be {"tenants": [...]}')
    tenants = []
    for i, raw in enumerate(config["tenants"]):
        try:
            tenants.append(TenantSpec.model_validate(raw))
        except ValidationError as err:
            raise SpecError(f"user_config.tenants[{i}]: {err}") from None
    for field in ("name", "api_key_sha256"):
        values = [getattr(t, field) for t in tenants]
        if len(set(values)) != len(values):
            raise SpecError(f"user_config.tenants: duplicate {field}")
    return tenants

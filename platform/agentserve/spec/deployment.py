"""DeploymentSpec, the whole deployment, and how one is read: spec_from_dict and load_spec
(YAML or JSON) raise SpecError naming each failing field path; to_yaml and spec_json_schema
(the source of the CRD and Helm values schema) write it back out."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from yaml.constructor import ConstructorError

from agentserve.spec.autoscaling import AutoscalingSpec
from agentserve.spec.base import _Spec
from agentserve.spec.models import ModelSpec
from agentserve.spec.server import ServerSpec, TracingSpec
from agentserve.spec.tenants import TenantSpec

_DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


TENANTS_APART = "tenants_apart"  # validation context key: tenants arrive separately


class SpecError(ValueError):
    """An invalid deployment spec; `errors` holds (field path, message) pairs."""

    def __init__(self, message: str, errors: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.errors = errors or []


class ModelNotInSpecError(SpecError, KeyError):
    """A model name (a `--model` flag, a policy's model) that the spec does not serve.

    A SpecError, so the CLI reports it as a user error, and a KeyError, as before."""

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return str(self.args[0])


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class DeploymentSpec(_Spec):
    """A whole agentserve deployment. `DeploymentSpec()` is the embedded CPU deployment."""

    name: str = Field(
        "agentserve",
        max_length=63,
        json_schema_extra={"pattern": _DNS1123_LABEL},
        description="Deployment name, a DNS-1123 label (it names Kubernetes objects).",
    )
    models: list[ModelSpec] = Field(
        default_factory=lambda: [ModelSpec()], min_length=1, description="Models to serve."
    )
    tenants: list[TenantSpec] = Field(
        default_factory=list, description="Tenants; empty = open mode (no keys, loopback only)."
    )
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, description="Scaling.")
    tracing: TracingSpec = Field(default_factory=TracingSpec, description="OpenTelemetry tracing.")
    server: ServerSpec = Field(default_factory=ServerSpec, description="HTTP ingress.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not re.fullmatch(_DNS1123_LABEL, name):
            raise ValueError(
                f"{name!r} must be a DNS-1123 label (it names Kubernetes objects): lowercase "
                "letters, digits and '-', starting and ending with a letter or digit"
            )
        return name

    @model_validator(mode="after")
    def _check_cross_fields(self, info: ValidationInfo) -> DeploymentSpec:
        problems = [
            *_duplicates("models", [m.name for m in self.models], "model name"),
            *_duplicates("tenants", [t.name for t in self.tenants], "tenant name"),
            *_adapter_clashes(self.models),
            *_duplicates("tenants", [t.api_key_sha256 for t in self.tenants], "api_key_sha256"),
        ]
        tenants_apart = bool((info.context or {}).get(TENANTS_APART))  # tenant_config.py
        if not self.tenants and not tenants_apart and not _is_loopback(self.server.host):
            problems.append(
                f"server.host: {self.server.host!r} is not a loopback address, but no tenants "
                "are configured, so the API would be open to the network; configure tenants "
                "(API keys) or bind to 127.0.0.1, ::1 or localhost"
            )
        if self.autoscaling.scale_to_zero_idle_s is None:
            problems += [
                f"models[{i}].replicas.min_replicas: is 0 but autoscaling.scale_to_zero_idle_s "
                "is not set; set it, or keep min_replicas >= 1"
                for i, m in enumerate(self.models)
                if m.replicas.min_replicas == 0
            ]
        if problems:
            raise ValueError("\n".join(problems))
        return self


def _duplicates(path: str, values: list[str], what: str) -> list[str]:
    seen: dict[str, int] = {}
    problems = []
    for i, value in enumerate(values):
        if value in seen:
            problems.append(f"{path}[{i}]: duplicate {what} (same as {path}[{seen[value]}])")
        else:
            seen[value] = i
    return problems


def _adapter_clashes(models: list[ModelSpec]) -> list[str]:
    """Adapter names that another adapter or a model already serves as: a request's
    `model` must name exactly one (admission/adapter_names.py)."""
    owners = {m.name: f"models[{i}].name" for i, m in enumerate(models)}
    problems = []
    for i, model in enumerate(models):
        for name in model.lora.adapters if model.lora else ():
            path = f"models[{i}].lora.adapters.{name}"
            if name in owners:
                problems.append(f"{path}: the name is taken (by {owners[name]})")
            else:
                owners[name] = path
    return problems


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('models', 0, 'drafter', 'path') -> 'models[0].drafter.path'."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _error_pairs(err: ValidationError) -> list[tuple[str, str]]:
    pairs = []
    for e in err.errors(include_url=False):
        path = _field_path(tuple(e["loc"]))
        if e["type"] == "value_error":
            message = str(e["ctx"]["error"])
        elif e["type"] == "extra_forbidden":
            message = "unknown field (not part of the spec)"
        else:
            message = e["msg"]
        for line in message.splitlines():
            if path:
                pairs.append((path, line))
            else:  # top-level cross-field errors name their own path: "path: message"
                own_path, _, own_message = line.partition(": ")
                pairs.append((own_path, own_message) if own_message else ("", line))
    return pairs


def spec_from_dict(
    data: Any, *, source: str | None = None, tenants_apart: bool = False
) -> DeploymentSpec:
    """Validate a parsed spec (a mapping); raise SpecError naming every failing field.
    `tenants_apart`: the tenants come separately (agentserve.tenant_config), so an empty
    `tenants` does not mean open mode."""
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise SpecError(f"{source or 'spec'}: the top level must be a mapping, got {kind}")
    try:
        return DeploymentSpec.model_validate(data, context={TENANTS_APART: tenants_apart})
    except ValidationError as err:
        pairs = _error_pairs(err)
        lines = [f"  {path}: {msg}" if path else f"  {msg}" for path, msg in pairs]
        header = f"invalid spec {source}:" if source else "invalid spec:"
        raise SpecError("\n".join([header, *lines]), pairs) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: list[Any] = []
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.append(key)
        return super().construct_mapping(node, deep=deep)


def load_spec(path: str | Path) -> DeploymentSpec:
    """Load and validate a spec from a YAML (or JSON) file; an empty file is the default."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"{path}: cannot read spec: {err.strerror or err}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, _UniqueKeyLoader)
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(f"{where}: invalid YAML: {problem}") from None
    return spec_from_dict({} if data is None else data, source=str(path))


def to_yaml(spec: DeploymentSpec) -> str:
    """Dump a spec as YAML that `load_spec` reads back to an equal spec."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def spec_json_schema() -> dict[str, Any]:
    """JSON schema of DeploymentSpec (validation mode): the source of the CRD and Helm schema."""
    return DeploymentSpec.model_json_schema(mode="validation")

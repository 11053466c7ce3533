"""The AgentServe CRD, generated from DeploymentSpec's JSON schema (never a hand copy).

`inline_schema` resolves pydantic's JSON schema into one self-contained tree; `structural`
turns that into a Kubernetes structural OpenAPI v3 schema; `json_schema` keeps draft-07
JSON Schema (for Helm's values.schema.json). agentserve_operator.chart renders both into
the chart (`python -m agentserve_operator.chart --write`); a test fails when the checked-in
copies drift.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from agentserve.spec import spec_json_schema

from agentserve_operator import resource as r

__all__ = ["cr_spec_schema", "crd_manifest", "json_schema", "structural"]

_DROP = {"title", "default", "additionalProperties", "$defs"}


def inline_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Resolve every local `$ref` (sibling keys such as description win); drop `$defs`."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            merged = {**walk(target), **{k: walk(v) for k, v in node.items() if k != "$ref"}}
            return merged
        return {k: walk(v) for k, v in node.items() if k != "$defs"}

    return walk(schema)


def cr_spec_schema() -> dict[str, Any]:
    """The CR's `spec`: DeploymentSpec plus `kubernetes`; tenants' api_key_sha256 optional."""
    schema = inline_schema(spec_json_schema())
    kube = inline_schema(r.KubernetesSpec.model_json_schema(mode="validation"))
    kube["description"] = r.KubernetesSpec.__doc__
    schema["properties"]["kubernetes"] = kube
    tenant = schema["properties"]["tenants"]["items"]
    tenant["required"] = [f for f in tenant.get("required", []) if f != "api_key_sha256"]
    tenant["properties"]["api_key_sha256"]["description"] += (
        " Optional in a CR when kubernetes.api_key_secret holds the tenant's key."
    )
    schema["description"] = (
        "An agentserve deployment: DeploymentSpec (models, drafter, tenants, autoscaling, "
        "tracing, server) plus cluster settings under `kubernetes`."
    )
    return schema


def structural(node: Any) -> Any:
    """JSON schema (inlined) -> Kubernetes structural schema.

    anyOf [X, null] -> X + nullable; numeric exclusiveMinimum/Maximum -> minimum + boolean;
    const -> enum; title/default/additionalProperties:false dropped (defaults stay in
    DeploymentSpec, written into descriptions); empty `required` dropped.
    """
    if isinstance(node, list):
        return [structural(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = _collapse_nullable(node)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP and not (key == "additionalProperties" and isinstance(value, dict)):
            continue
        if key == "properties":
            out[key] = {name: structural(sub) for name, sub in value.items()}
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "required" and not value:
            continue
        else:
            out[key] = structural(value)
    if node.get("type") == "object" and node.get("additionalProperties") is True:
        out["x-kubernetes-preserve-unknown-fields"] = True  # a free-form map (engine_args)
    if "default" in node and node["default"] is not None and "description" in out:
        out["description"] = f"{out['description']} Default: {json.dumps(node['default'])}."
    return out


def json_schema(node: Any) -> Any:
    """JSON schema (inlined) -> draft-07 JSON Schema for Helm: titles and defaults dropped,
    anyOf [X, null] -> type [X, "null"]."""
    if isinstance(node, list):
        return [json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    nullable = _collapse_nullable(node)
    if nullable.pop("nullable", False) and "type" in nullable:
        nullable["type"] = [nullable["type"], "null"]
    out = {}
    for key, value in nullable.items():
        if key in ("title", "default"):
            continue
        if key == "properties":
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        else:
            out[key] = json_schema(value)
    return out


def _collapse_nullable(node: dict[str, Any]) -> dict[str, Any]:
    """{anyOf: [X, {type: null}], ...rest} -> {...X, ...rest, nullable: true}."""
    options = node.get("anyOf")
    if not options or {"type": "null"} not in options:
        return node
    others = [o for o in options if o != {"type": "null"}]
    if len(others) != 1:
        raise ValueError(f"cannot express anyOf {options} in a structural schema")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    return {**others[0], **rest, "nullable": True}


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Models", "type": "string", "jsonPath": ".status.modelNames"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.readyReplicas",
         "description": "Ready model replicas / desired."},
        {"name": "Status", "type": "string",
         "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]  # fmt: skip


def _status_schema() -> dict[str, Any]:
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer"},
        },
    }
    model = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "readyReplicas": {"type": "integer"},
            "minReplicas": {"type": "integer"},
            "maxReplicas": {"type": "integer"},
            "deploymentStatus": {"type": "string"},
        },
    }
    return {
        "type": "object",
        "description": "Observed state, written by the operator.",
        "properties": {
            "observedGeneration": {"type": "integer"},
            "conditions": {"type": "array", "items": condition},
            "endpoint": {"type": "string", "description": "OpenAI base URL in the cluster."},
            "modelNames": {"type": "string"},
            "readyReplicas": {"type": "string", "description": "ready/desired, all models."},
            "models": {"type": "array", "items": model},
        },
        "x-kubernetes-preserve-unknown-fields": True,  # kopf keeps its progress here
    }


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) for AgentServe.

    No scale subresource: replicas are per model and owned by Ray Serve's autoscaler, so
    one `spec.replicas` to scale would fight it.
    """
    version = {
        "name": r.VERSION,
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        "additionalPrinterColumns": _printer_columns(),
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "description": "AgentServe: one agentserve deployment on KubeRay.",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": structural(cr_spec_schema()),
                    "status": _status_schema(),
                },
                "required": ["spec"],
            }
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{r.PLURAL}.{r.GROUP}",
            "labels": {"app.kubernetes.io/name": "agentserve"},
        },
        "spec": {
            "group": r.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": r.KIND,
                "plural": r.PLURAL,
                "singular": r.SINGULAR,
                "listKind": f"{r.KIND}List",
                "shortNames": r.SHORT_NAMES,
                "categories": ["all", "agentserve"],
            },
            "versions": [copy.deepcopy(version)],
        },
    }

"""Validate objects against KubeRay's published CRDs (tests/data/kuberay-crds/<tag>/) as a
Kubernetes API server with strict field validation (`kubectl apply --validate=strict`,
the default of server-side apply) does for a structural schema:

- a field the schema does not define is an error (the server would prune it, or refuse it
  under strict validation), unless `x-kubernetes-preserve-unknown-fields` keeps it;
- `type` (with `nullable`), `x-kubernetes-int-or-string`, `enum`, `required`, `pattern`,
  bounds on numbers, lengths and items are checked.
Not checked: CEL rules (`x-kubernetes-validations`) and list-map key uniqueness, which need
an API server; `metadata` at the root, which the server checks as ObjectMeta.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

__all__ = ["CRD_DIR", "TAGS", "crd", "errors", "validate"]

CRD_DIR = Path(__file__).resolve().parents[2] / "data" / "kuberay-crds"
TAGS = {"1.4": "v1.4.2", "1.5": "v1.5.2", "1.6": "v1.6.2"}  # supported KubeRay -> data
_KEYWORDS = ("enum", "pattern", "minLength", "maxLength", "minItems", "maxItems",
             "minProperties", "maxProperties", "multipleOf", "uniqueItems")  # fmt: skip


@functools.cache
def crd(version: str, plural: str = "rayservices") -> dict[str, Any]:
    """The CustomResourceDefinition `<plural>.ray.io` of KubeRay `version` (1.4, 1.5, 1.6)."""
    path = CRD_DIR / TAGS[version] / f"ray.io_{plural}.yaml"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 1-2 MB each: libyaml if built
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)


@functools.cache
def _validator(version: str, plural: str, api_version: str) -> jsonschema.Draft7Validator:
    [served] = [v for v in crd(version, plural)["spec"]["versions"] if v["name"] == api_version]
    schema = to_jsonschema(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the server's own
    return jsonschema.Draft7Validator(schema)


def to_jsonschema(node: dict[str, Any]) -> dict[str, Any]:
    """One structural OpenAPI v3 schema node -> JSON Schema (draft 7) that refuses unknown
    fields where the API server would drop them."""
    out: dict[str, Any] = {}
    kind = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    elif kind:
        out["type"] = [kind, "null"] if node.get("nullable") else kind
    out.update({k: node[k] for k in _KEYWORDS if k in node})
    if "required" in node:
        out["required"] = list(node["required"])
    _bounds(node, out)
    if "properties" in node:
        out["properties"] = {k: to_jsonschema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = to_jsonschema(node["items"])
    for combinator in ("allOf", "anyOf", "oneOf"):
        if combinator in node:
            out.setdefault("allOf", []).append(
                {combinator: [to_jsonschema(s) for s in node[combinator]]}
            )
    if kind == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = to_jsonschema(extra)
        elif extra is not True:
            out["additionalProperties"] = False  # an undefined field: pruned or refused
    if node.get("x-kubernetes-embedded-resource"):
        for key in ("apiVersion", "kind", "metadata"):
            out.setdefault("properties", {}).setdefault(key, {})
    return out


def _bounds(node: dict[str, Any], out: dict[str, Any]) -> None:
    """OpenAPI 3.0's boolean exclusiveMinimum/Maximum -> draft 7's numeric form."""
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if bound in node:
            out[exclusive if node.get(exclusive) else bound] = node[bound]


def errors(obj: dict[str, Any], version: str) -> list[str]:
    """`path: message` of each way `obj` (a RayService or RayCluster) breaks the CRD of
    KubeRay `version`; [] when a strict API server would take it unchanged."""
    plural = {"RayService": "rayservices", "RayCluster": "rayclusters"}[obj["kind"]]
    api_version = obj["apiVersion"].split("/")[-1]
    found = _validator(version, plural, api_version).iter_errors(obj)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found)


def validate(obj: dict[str, Any], version: str) -> None:
    """Raise AssertionError listing every error of `obj` against KubeRay `version`."""
    problems = errors(obj, version)
    assert not problems, f"rejected by KubeRay {version}'s CRD:\n  " + "\n  ".join(problems)

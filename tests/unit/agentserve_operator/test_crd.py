"""CRD and values schema: generated from DeploymentSpec, structural, in sync with the chart."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
import yaml
from agentserve.spec import DeploymentSpec
from agentserve_operator import chart, crd
from agentserve_operator.helm_values import values_schema
from operator_cases import GPU_CR


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}], "description": "d"},
         {"type": "integer", "minimum": 0, "description": "d", "nullable": True}),
        ({"type": "number", "exclusiveMinimum": 0},
         {"type": "number", "minimum": 0, "exclusiveMinimum": True}),
        ({"type": "string", "const": "dflash"}, {"type": "string", "enum": ["dflash"]}),
        ({"type": "object", "additionalProperties": False, "properties": {}, "title": "T"},
         {"type": "object", "properties": {}}),
        ({"type": "object", "additionalProperties": {"type": "string"}},
         {"type": "object", "additionalProperties": {"type": "string"}}),
        ({"type": "integer", "default": 7, "description": "n."},
         {"type": "integer", "description": "n. Default: 7."}),
    ],
)  # fmt: skip
def test_structural_conversion_table(schema, expected):
    assert crd.structural(schema) == expected


def test_anyof_of_two_real_types_is_refused():
    with pytest.raises(ValueError, match="structural"):
        crd.structural({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})


def test_crd_spec_is_structural():
    spec = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(spec):
        if not isinstance(node, dict) or path.endswith((".properties", ".x-kubernetes")):
            continue
        assert "$ref" not in node and "anyOf" not in node and "const" not in node, path
        assert "title" not in node and node.get("additionalProperties") is not False, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path
        if "properties" in node and not path.endswith(".properties"):
            assert node.get("type") == "object", path


def test_crd_covers_every_spec_field():
    props = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = props["properties"]["spec"]["properties"]
    assert set(DeploymentSpec.model_fields) | {"kubernetes"} == set(spec)
    model = spec["models"]["items"]["properties"]
    assert model["drafter"]["properties"]["num_speculative_tokens"]["maximum"] == 64
    tenant = spec["tenants"]["items"]
    assert "api_key_sha256" not in tenant.get("required", [])


def test_crd_names_and_columns():
    manifest = crd.crd_manifest()
    names = manifest["spec"]["names"]
    assert (names["kind"], names["plural"], manifest["spec"]["scope"]) == (
        "AgentServe", "agentserves", "Namespaced")  # fmt: skip
    assert names["shortNames"]
    version = manifest["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Models", "Ready", "Status", "Age"} <= set(columns)


def test_checked_in_files_match_the_generator():
    """Fails when spec/ changed and `python -m agentserve_operator.chart --write` was not run."""
    for path, text in chart.generated_files().items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: regenerate it"
    assert chart.main(["--check"]) == 0


def test_crd_validates_with_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(yaml.safe_load(chart.CRD_PATH.read_text()), "1.30", strict=True)


def _spec_validator():
    """JSON schema of the CR spec (the CRD's structural schema, nullable honoured)."""
    schema = values_schema()["properties"]["agentServe"]["properties"]["spec"]
    return jsonschema.Draft7Validator(schema)


def test_example_cr_spec_passes_the_values_schema():
    assert list(_spec_validator().iter_errors(GPU_CR["spec"])) == []


def test_values_schema_rejects_unknown_and_out_of_range_fields():
    bad = {"models": [{"source": "/m", "max_num_seqs": 0, "typo": 1}]}
    messages = [e.message for e in _spec_validator().iter_errors(bad)]
    assert any("typo" in m for m in messages) and any("minimum" in m for m in messages)


def test_values_schema_is_valid_json_schema():
    schema = json.loads(chart.VALUES_SCHEMA_PATH.read_text())
    jsonschema.Draft7Validator.check_schema(schema)


def test_crd_module_imports_neither_the_values_schema_nor_the_chart_writer():
    """crd.py <- helm_values.py <- chart.py, one way: importing crd alone loads neither."""
    code = (
        "import sys, agentserve_operator.crd; "
        "print(sorted(m for m in sys.modules if m.startswith('agentserve_operator.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() and "helm_values" not in out.stdout and "chart" not in out.stdout

"""Tests for agentserve.spec: defaults, validation errors by field path, loading, schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentserve.spec import (
    BUNDLED_MODEL,
    DeploymentSpec,
    SpecError,
    hash_api_key,
    load_spec,
    spec_from_dict,
    spec_json_schema,
    to_yaml,
)

EXAMPLE = Path(__file__).parents[3] / "examples" / "specs" / "embedded.yaml"
KEY_A = hash_api_key("sk-tenant-a")
KEY_B = hash_api_key("sk-tenant-b")
SLA = {"ttft_p95_ms": 500, "tpot_p95_ms": 50}


def tenant(name: str, key: str = KEY_A, **extra: Any) -> dict[str, Any]:
    return {"name": name, "api_key_sha256": key, "sla": dict(SLA), **extra}


def with_model(**fields: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", **fields}]}


# --- defaults -------------------------------------------------------------------------


def test_defaults_are_the_embedded_cpu_deployment() -> None:
    spec = DeploymentSpec()
    assert spec.name == "agentserve"
    assert spec.tenants == []
    assert spec.server.host == "127.0.0.1"
    [model] = spec.models
    assert (model.name, model.source) == (BUNDLED_MODEL, BUNDLED_MODEL)
    assert (model.engine, model.dtype, model.max_model_len) == ("vllm", "bfloat16", 2048)
    assert (model.replicas.min_replicas, model.replicas.max_replicas) == (1, 1)
    assert model.replicas.num_gpus == 0
    assert model.replicas.num_cpus == 2
    assert model.drafter.enabled is False
    assert (model.drafter.method, model.drafter.num_speculative_tokens) == ("dflash", 7)
    assert model.async_scheduling is False
    assert spec.autoscaling.policy == "sla"
    assert spec.autoscaling.scale_to_zero_idle_s is None
    assert spec.tracing.enabled is None and spec.tracing.otlp_endpoint is None  # off: no endpoint


def test_empty_dict_equals_defaults() -> None:
    assert spec_from_dict({}) == DeploymentSpec()


@pytest.mark.parametrize("alias", ["bundled", "Bundled", BUNDLED_MODEL.upper()])
def test_bundled_aliases_normalize(alias: str) -> None:
    spec = spec_from_dict(with_model(source=alias, drafter={"enabled": True}))
    assert spec.models[0].source == BUNDLED_MODEL


def test_hash_api_key() -> None:
    assert hash_api_key("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    with pytest.raises(ValueError, match="empty"):
        hash_api_key("")


# --- valid specs ------------------------------------------------------------------------

VALID: list[tuple[str, dict[str, Any]]] = [
    ("empty", {}),
    ("fake engine", with_model(engine="fake")),
    ("local abs dir", with_model(source="/models/qwen3-8b", drafter={"path": "/d"})),
    ("local rel dir", with_model(source="./weights", dtype="float16")),
    ("home dir", with_model(source="~/models/x", dtype="auto")),
    ("bundled drafter", with_model(drafter={"enabled": True, "num_speculative_tokens": 15})),
    ("drafter tokens 64", with_model(drafter={"enabled": True, "num_speculative_tokens": 64})),
    (
        "gpu replicas",
        with_model(
            replicas={
                "min_replicas": 1,
                "max_replicas": 4,
                "initial_replicas": 2,
                "num_gpus": 1,
                "node_selector": {"nvidia.com/gpu.product": "H100"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            },
            async_scheduling=True,
            max_num_seqs=64,
        ),
    ),
    (
        "scale to zero",
        {
            **with_model(replicas={"min_replicas": 0, "max_replicas": 2}),
            "autoscaling": {"scale_to_zero_idle_s": 300},
        },
    ),
    ("two models", {"models": [{"name": "a"}, {"name": "b", "engine": "fake"}]}),
    (
        "tenants, public host",
        {
            "tenants": [
                tenant("a", KEY_A, rate_limit={"requests_per_minute": 60}),
                tenant("b", KEY_B, sla_class="batch"),
            ],
            "server": {"host": "0.0.0.0", "metrics_port": 9090},
        },
    ),
    ("ipv6 loopback", {"server": {"host": "::1"}}),
    ("localhost", {"server": {"host": "localhost"}}),
    ("127.0.0.2", {"server": {"host": "127.0.0.2"}}),
    ("ray policy", {"autoscaling": {"policy": "ray_default"}}),
    (
        "tracing",
        {"tracing": {"enabled": True, "otlp_endpoint": "http://otel:4318", "sample_ratio": 0}},
    ),
    ("k8s name", {"name": "agent-serve-01"}),
]


@pytest.mark.parametrize(("label", "data"), VALID, ids=[v[0] for v in VALID])
def test_valid_specs(label: str, data: dict[str, Any]) -> None:
    spec = spec_from_dict(copy.deepcopy(data))
    assert isinstance(spec, DeploymentSpec)


# --- invalid specs: (label, data, field path, message fragment) -------------------------

INVALID: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "speculative tokens > 64",
        with_model(drafter={"num_speculative_tokens": 65}),
        "models[0].drafter.num_speculative_tokens",
        "less than or equal to 64",
    ),
    (
        "speculative tokens 0",
        with_model(drafter={"num_speculative_tokens": 0}),
        "models[0].drafter.num_speculative_tokens",
        "greater than or equal to 1",
    ),
    (
        "speculative tokens >= max_model_len",
        with_model(max_model_len=16, drafter={"enabled": True, "num_speculative_tokens": 16}),
        "models[0]",
        "smaller than max_model_len",
    ),
    (
        "drafter method",
        with_model(drafter={"method": "eagle"}),
        "models[0].drafter.method",
        "'dflash'",
    ),
    (
        "drafter for a local model needs a path",
        with_model(source="/models/x", drafter={"enabled": True}),
        "models[0]",
        "drafter.path is required",
    ),
    ("bad hub id source", with_model(source="Qwen/Qwen3/8B"), "models[0].source", "ORG/NAME"),
    ("unknown bundled", with_model(source="llama"), "models[0].source", "bundled model"),
    ("dtype", with_model(dtype="int8"), "models[0].dtype", "bfloat16"),
    ("engine", with_model(engine="sglang"), "models[0].engine", "vllm"),
    (
        "min > max replicas",
        with_model(replicas={"min_replicas": 3, "max_replicas": 2}),
        "models[0].replicas",
        "min_replicas (3) must be <= max_replicas (2)",
    ),
    (
        "initial outside bounds",
        with_model(replicas={"max_replicas": 2, "initial_replicas": 3}),
        "models[0].replicas",
        "initial_replicas (3)",
    ),
    (
        "negative gpus",
        with_model(replicas={"num_gpus": -1}),
        "models[0].replicas.num_gpus",
        "greater than or equal to 0",
    ),
    (
        "toleration operator",
        with_model(replicas={"tolerations": [{"operator": "In"}]}),
        "models[0].replicas.tolerations[0].operator",
        "Equal",
    ),
    (
        "min_replicas 0 without scale to zero",
        with_model(replicas={"min_replicas": 0}),
        "models[0].replicas.min_replicas",
        "scale_to_zero_idle_s",
    ),
    (
        "duplicate model names",
        {"models": [{"name": "a"}, {"name": "b"}, {"name": "a"}]},
        "models[2]",
        "duplicate model name (same as models[0])",
    ),
    ("no models", {"models": []}, "models", "at least 1"),
    (
        "second tenant ttft",
        {"tenants": [tenant("a"), tenant("b", KEY_B, sla={"ttft_p95_ms": 0, "tpot_p95_ms": 5})]},
        "tenants[1].sla.ttft_p95_ms",
        "greater than 0",
    ),
    (
        "tenant without sla",
        {"tenants": [{"name": "a", "api_key_sha256": KEY_A}]},
        "tenants[0].sla",
        "Field required",
    ),
    (
        "key in clear",
        {"tenants": [tenant("a", "sk-secret")]},
        "tenants[0].api_key_sha256",
        "never the key itself",
    ),
    (
        "uppercase hash",
        {"tenants": [tenant("a", KEY_A.upper())]},
        "tenants[0].api_key_sha256",
        "lowercase hex",
    ),
    (
        "rate limit zero",
        {"tenants": [tenant("a", rate_limit={"requests_per_minute": 0})]},
        "tenants[0].rate_limit.requests_per_minute",
        "greater than 0",
    ),
    (
        "duplicate tenant names",
        {"tenants": [tenant("a", KEY_A), tenant("a", KEY_B)]},
        "tenants[1]",
        "duplicate tenant name",
    ),
    (
        "duplicate tenant keys",
        {"tenants": [tenant("a", KEY_A), tenant("b", KEY_A)]},
        "tenants[1]",
        "duplicate api_key_sha256",
    ),
    (
        "hysteresis band",
        {"autoscaling": {"upscale_sla_ratio": 1.0, "downscale_sla_ratio": 1.0}},
        "autoscaling",
        "hysteresis",
    ),
    (
        "utilization > 1",
        {"autoscaling": {"target_utilization": 1.5}},
        "autoscaling.target_utilization",
        "less than or equal to 1",
    ),
    ("policy", {"autoscaling": {"policy": "hpa"}}, "autoscaling.policy", "'sla'"),
    (
        "sample ratio",
        {"tracing": {"sample_ratio": 2}},
        "tracing.sample_ratio",
        "less than or equal to 1",
    ),
    (
        "otlp without scheme",
        {"tracing": {"otlp_endpoint": "otel:4318"}},
        "tracing.otlp_endpoint",
        "http://",
    ),
    ("port range", {"server": {"port": 70000}}, "server.port", "65535"),
    (
        "metrics port clash",
        {"server": {"metrics_port": 8000}},
        "server",
        "metrics_port must differ",
    ),
    (
        "an ingress replica's admin port clashes with the API port",
        {"server": {"metrics_port": 7999, "ingress_replicas": 2}},
        "server",
        "metrics_port + ingress_replicas - 1",
    ),
    (
        "open mode on all interfaces",
        {"server": {"host": "0.0.0.0"}},
        "server.host",
        "configure tenants (API keys) or bind to 127.0.0.1",
    ),
    (
        "open mode on a hostname",
        {"server": {"host": "api.example.com"}},
        "server.host",
        "not a loopback address",
    ),
    ("name uppercase", {"name": "AgentServe"}, "name", "DNS-1123"),
    ("name trailing dash", {"name": "agent-"}, "name", "DNS-1123"),
    ("name too long", {"name": "a" * 64}, "name", "at most 63"),
    ("top-level extra", {"replicas": 2}, "replicas", "unknown field"),
    (
        "nested extra",
        with_model(drafter={"enable": True}),
        "models[0].drafter.enable",
        "unknown field",
    ),
    (
        "tenant extra (clear key)",
        {"tenants": [tenant("a", api_key="sk-1")]},
        "tenants[0].api_key",
        "unknown field",
    ),
    ("wrong type", {"server": {"port": "http"}}, "server.port", "integer"),
]


@pytest.mark.parametrize(
    ("label", "data", "path", "fragment"), INVALID, ids=[c[0] for c in INVALID]
)
def test_invalid_specs_name_the_field(label: str, data: dict, path: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_dict(copy.deepcopy(data))
    assert f"  {path}: " in str(info.value)
    assert fragment in str(info.value)
    assert any(p == path and fragment in m for p, m in info.value.errors), info.value.errors


def test_every_failing_field_is_reported() -> None:
    data = {
        "models": [{"drafter": {"num_speculative_tokens": 65}}],
        "tenants": [tenant("a"), tenant("b", KEY_B, sla={"ttft_p95_ms": -1, "tpot_p95_ms": 1})],
    }
    with pytest.raises(SpecError) as info:
        spec_from_dict(data, source="deploy.yaml")
    message = str(info.value)
    assert message.startswith("invalid spec deploy.yaml:")
    assert "models[0].drafter.num_speculative_tokens: Input should be less than or equal to 64" in (
        message
    )
    assert "tenants[1].sla.ttft_p95_ms: Input should be greater than 0" in message
    assert len(info.value.errors) == 2


def test_top_level_cross_field_errors_are_all_reported() -> None:
    data = {"models": [{"name": "a"}, {"name": "a"}], "server": {"host": "0.0.0.0"}}
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    assert [p for p, _ in info.value.errors] == ["models[1]", "server.host"]


@pytest.mark.parametrize("data", [[1, 2], "models: []", 3, None])
def test_non_mapping_top_level(data: Any) -> None:
    with pytest.raises(SpecError, match="top level must be a mapping"):
        spec_from_dict(data)


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)


# --- loading and dumping ----------------------------------------------------------------


def test_yaml_round_trip(tmp_path: Path) -> None:
    spec = spec_from_dict(
        {
            "name": "prod",
            "models": [
                {
                    "name": "qwen",
                    "source": "/models/qwen",
                    "drafter": {"enabled": True, "path": "/drafters/qwen"},
                    "replicas": {
                        "min_replicas": 0,
                        "max_replicas": 3,
                        "num_gpus": 1,
                        "tolerations": [{"key": "gpu", "effect": "NoSchedule"}],
                    },
                }
            ],
            "tenants": [tenant("a", KEY_A, rate_limit={"tokens_per_minute": 10_000})],
            "autoscaling": {"scale_to_zero_idle_s": 600},
            "server": {"host": "0.0.0.0"},
        }
    )
    text = to_yaml(spec)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert load_spec(path) == spec
    assert load_spec(str(path)) == spec
    assert to_yaml(load_spec(path)) == text


def test_default_round_trip() -> None:
    assert spec_from_dict(yaml.safe_load(to_yaml(DeploymentSpec()))) == DeploymentSpec()


def test_load_json(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "from-json", "server": {"port": 9000}}))
    spec = load_spec(path)
    assert (spec.name, spec.server.port) == ("from-json", 9000)


def test_load_error_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text("models:\n  - name: m\n    drafter:\n      num_speculative_tokens: 100\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(path) in str(info.value)
    assert "models[0].drafter.num_speculative_tokens: Input should be less than or equal to 64" in (
        str(info.value)
    )


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: a\nserver:\n  port: 8000\n   host: x\n")
    with pytest.raises(SpecError, match=r"bad\.yaml:4:\d+: invalid YAML"):
        load_spec(path)


def test_json_syntax_error_has_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "name": "a",\n}\n')
    with pytest.raises(SpecError, match=r"bad\.json:3:\d+: invalid JSON"):
        load_spec(path)


def test_duplicate_yaml_key_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("tenants: []\nserver:\n  port: 1\ntenants: []\n")
    with pytest.raises(SpecError, match=r"dup\.yaml:4:1: invalid YAML: duplicate key 'tenants'"):
        load_spec(path)


def test_non_mapping_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- name: a\n")
    with pytest.raises(SpecError, match=r"list\.yaml: the top level must be a mapping.*list"):
        load_spec(path)


def test_empty_file_is_the_default(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing here\n")
    assert load_spec(path) == DeploymentSpec()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "nope.yaml")


@pytest.mark.skipif(not EXAMPLE.exists(), reason="example spec not present")
def test_example_spec_loads() -> None:
    spec = load_spec(EXAMPLE)
    assert spec.models[0].source == BUNDLED_MODEL
    assert spec.server.host == "127.0.0.1"


# --- JSON schema ------------------------------------------------------------------------


def _walk_properties(node: Any, where: str = "$") -> list[tuple[str, dict]]:
    """Every (path, property schema) under any `properties`, including $defs."""
    found: list[tuple[str, dict]] = []
    if isinstance(node, dict):
        for name, prop in node.get("properties", {}).items():
            found.append((f"{where}.{name}", prop))
        for key, value in node.items():
            found += _walk_properties(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _walk_properties(value, f"{where}[{i}]")
    return found


def test_every_schema_property_has_a_description() -> None:
    schema = spec_json_schema()
    props = _walk_properties(schema)
    assert len(props) > 40
    missing = [path for path, prop in props if not prop.get("description")]
    assert missing == []


def test_schema_is_structural_friendly() -> None:
    schema = spec_json_schema()
    text = json.dumps(schema)
    for construct in ('"const"', '"oneOf"', '"allOf"', '"not"', '"patternProperties"'):
        assert construct not in text, construct
    assert set(schema["$defs"]) >= {"ModelSpec", "DrafterSpec", "TenantSpec", "SLASpec"}
    for name, definition in schema["$defs"].items():
        assert definition["additionalProperties"] is False, name
    assert schema["additionalProperties"] is False
    # anyOf appears only as "T or null" (the CRD generator turns it into nullable: true)
    for _, prop in _walk_properties(schema):
        if "anyOf" in prop:
            assert len(prop["anyOf"]) == 2 and {"type": "null"} in prop["anyOf"]


def test_schema_carries_the_edge_patterns() -> None:
    defs = spec_json_schema()["$defs"]
    assert defs["TenantSpec"]["properties"]["api_key_sha256"]["pattern"] == "^[0-9a-f]{64}$"
    methods = ["dflash", "ngram", "hybrid", "suffix", "eagle3", "mtp"]
    assert defs["DrafterSpec"]["properties"]["method"]["enum"] == methods
    assert spec_json_schema()["properties"]["name"]["pattern"].startswith("^[a-z0-9]")


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ({"source": "Qwen/Qwen3-8B"}, "Qwen/Qwen3-8B"),  # was the bundled model's name
        ({"source": "bundled"}, "smollm2-135m-instruct"),
        ({"source": "/models/My Model"}, "My-Model"),
        ({"source": "Qwen/Qwen3-8B", "name": "qwen"}, "qwen"),  # a named model keeps it
        ({}, "smollm2-135m-instruct"),
    ],
)
def test_an_unnamed_model_is_served_under_its_source(model: dict, name: str) -> None:
    assert spec_from_dict({"models": [model]}).models[0].name == name

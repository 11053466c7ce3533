"""agentserve.spec as a package: every name the project imports from it resolves, and the SLA
objectives leave milliseconds in one place (SLASpec.seconds)."""

from __future__ import annotations

import ast
from pathlib import Path

import agentserve.spec
from agentserve.api.auth import OPEN_TENANT, Tenant
from agentserve.serve.metrics import sla_objectives
from agentserve.spec import DeploymentSpec, RateLimitSpec, SLASpec, hash_api_key

REPO = Path(__file__).parents[3]
ROOTS = ("platform", "operators", "tests", "examples", "dflash")


def _names_imported_from_spec() -> set[tuple[str, str]]:
    found = set()
    for root in ROOTS:
        for path in (REPO / root).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "agentserve.spec":
                    found |= {(str(path.relative_to(REPO)), a.name) for a in node.names}
    return found


def test_every_name_imported_from_agentserve_spec_resolves():
    imported = _names_imported_from_spec()
    assert len(imported) > 100  # the walk found the project's imports
    assert {(path, name) for path, name in imported if not hasattr(agentserve.spec, name)} == set()


def test_all_names_the_public_entry_points():
    assert sorted(agentserve.spec.__all__) == sorted(
        [
            "BUNDLED_MODEL",
            "DeploymentSpec",
            "ModelNotInSpecError",
            "SpecError",
            "hash_api_key",
            "load_spec",
            "spec_from_dict",
            "spec_json_schema",
            "to_yaml",
        ]
    )


def test_sla_seconds():
    assert SLASpec(ttft_p95_ms=1500, tpot_p95_ms=60).seconds() == (1.5, 0.06)
    assert SLASpec().seconds() == (1.0, 0.1)


def test_sla_objectives_are_the_slas_in_seconds():
    key = hash_api_key("sk-a")
    sla = {"ttft_p95_ms": 500, "tpot_p95_ms": 50}
    tenant = {"name": "a", "api_key_sha256": key, "sla": sla}
    spec = DeploymentSpec.model_validate({"tenants": [tenant]})
    assert sla_objectives(spec) == {"a": (0.5, 0.05)}
    open_spec = DeploymentSpec.model_validate({"autoscaling": {"open_mode_sla": sla}})
    assert sla_objectives(open_spec) == {OPEN_TENANT: (0.5, 0.05)}
    tenants = [Tenant("b", SLASpec(ttft_p95_ms=2000, tpot_p95_ms=200), RateLimitSpec())]
    assert sla_objectives(spec, tenants) == {"b": (2.0, 0.2)}

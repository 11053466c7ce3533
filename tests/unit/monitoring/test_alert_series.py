"""The alert rules read only series the ingress exports: every metric and label a rule
names is in a live ingress's /metrics (fake engine, no Ray), and the series the alerts
compare with (capacity, min replicas, acceptance floor, engine up) carry the spec's values.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.serve.metrics import ModelLimits, model_limits
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

LOCAL = "http://localhost"  # open mode answers only trusted Host names

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "helm" / "agentserve" / "files" / "alerts" / "agentserve.rules.yaml"
RECORDED = re.compile(r"\b(agentserve:[a-z0-9_:]+)")
SELECTOR = re.compile(r"\b(agentserve_[a-z0-9_]+)(?:\{([^}]*)\})?")
GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")
MATCHER_KEY = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
MSG = [{"role": "user", "content": "hello there world"}]


def _spec() -> DeploymentSpec:
    return DeploymentSpec.model_validate(
        {
            "models": [
                {
                    "name": "m",
                    "engine": "fake",
                    "max_model_len": 64,
                    "max_num_seqs": 4,
                    "replicas": {"min_replicas": 1, "max_replicas": 3},
                    "drafter": {"enabled": True, "method": "ngram", "min_acceptance_length": 1.5},
                },
                {"name": "plain", "engine": "fake", "max_model_len": 64},
            ],
            "server": {"max_queue_len": 8},
        }
    )


class _NoStats(LocalBackend):
    """A backend whose engine never answers stats (a hung or dead engine)."""

    async def stats(self):
        raise TimeoutError("no answer")


def _scrape(backends: dict) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items: value} of /metrics after one request to model m."""
    for backend in backends.values():
        asyncio.run(backend.engine.start())
    client = TestClient(create_app(_spec(), backends), base_url=LOCAL, client=("127.0.0.1", 50000))
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 200
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


@pytest.fixture(scope="module")
def exported() -> dict[str, dict[tuple, float]]:
    return _scrape({name: LocalBackend(FakeEngine(name, 64)) for name in ("m", "plain")})


def test_model_limits_come_from_the_spec():
    assert model_limits(_spec()) == {
        "m": ModelLimits(capacity=4 * 3 + 8, min_replicas=1, acceptance_floor=1.5),
        "plain": ModelLimits(capacity=16 * 1 + 8, min_replicas=1, acceptance_floor=None),
    }


def test_ingress_exports_the_limits_the_alerts_compare_with(exported):
    assert exported["agentserve_requests_capacity"] == {
        (("model", "m"),): 20.0,
        (("model", "plain"),): 24.0,
    }
    assert exported["agentserve_replicas_min"] == {(("model", "m"),): 1, (("model", "plain"),): 1}
    # only the model that speculates has a floor
    assert exported["agentserve_spec_decode_acceptance_floor"] == {(("model", "m"),): 1.5}
    assert exported["agentserve_engine_up"] == {(("model", "m"),): 1, (("model", "plain"),): 1}
    assert exported["agentserve_replicas_ready"] == {
        (("model", "m"),): 1,
        (("model", "plain"),): 1,
    }


def test_engine_up_is_zero_when_stats_do_not_answer():
    backends = {"m": LocalBackend(FakeEngine("m", 64)), "plain": _NoStats(FakeEngine("plain", 64))}
    samples = _scrape(backends)
    assert samples["agentserve_engine_up"] == {(("model", "m"),): 1, (("model", "plain"),): 0}
    # the replica count is still refreshed although stats failed
    assert samples["agentserve_replicas_ready"][(("model", "plain"),)] == 1


RULE_LIST = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


@pytest.mark.parametrize("expr", [r["expr"] for r in RULE_LIST])
def test_every_rule_names_exported_metrics_and_labels(expr, exported):
    labelled = {name: {k for key in series for k, _ in key} for name, series in exported.items()}
    selectors = SELECTOR.findall(expr)
    recorded = set(RECORDED.findall(expr))
    assert selectors or recorded, f"no agentserve series in {expr!r}"
    assert recorded <= {r["record"] for r in RULE_LIST if "record" in r}
    labels: set[str] = set()
    for name, matchers in selectors:
        assert name in labelled, f"{name} is not exported (have {sorted(labelled)})"
        keys = set(MATCHER_KEY.findall(matchers))
        assert keys <= labelled[name], f"{name} has no label(s) {keys - labelled[name]}"
        labels |= labelled[name]
    for group in GROUPING.findall(expr):
        wanted = {g.strip() for g in group.split(",") if g.strip()}
        assert wanted <= labels, f"grouping by {wanted - labels} in {expr!r}"

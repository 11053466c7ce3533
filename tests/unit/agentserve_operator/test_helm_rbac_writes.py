"""The chart's RBAC lets the operator write every kind of child it applies (with the
Prometheus Operator CRDs present: ServiceMonitor and PodMonitor too), cluster-wide and in
watched namespaces; a kind added to the manifests without its rule fails here."""

from __future__ import annotations

import pytest
from agentserve_operator.chart import CHART_DIR
from agentserve_operator.fake import FakeCluster
from agentserve_operator.reconcile import MONITORING_CRD, reconcile
from operator_cases import allow_references
from test_helm import HELM, chart, render  # noqa: F401  (chart: the fixture)
from test_helm_rbac import _allows, operator_rules

PLURALS = {"ConfigMap": "configmaps", "Service": "services", "RayService": "rayservices",
           "NetworkPolicy": "networkpolicies", "ServiceMonitor": "servicemonitors",
           "PodMonitor": "podmonitors", "PodDisruptionBudget": "poddisruptionbudgets"}  # fmt: skip


def _applied_kinds(cr: dict) -> set[tuple[str, str]]:
    cluster = FakeCluster(crds={MONITORING_CRD})
    keys = {t["name"]: f"sk-{t['name']}" for t in cr["spec"]["tenants"]}
    cluster.put({"apiVersion": "v1", "kind": "Secret", "stringData": keys,
                 "metadata": {"name": cr["spec"]["kubernetes"]["api_key_secret"]}})  # fmt: skip
    allow_references(cluster, cr)
    result = reconcile(cluster, cluster.put(cr), "2030-01-01T00:00:00Z")
    assert result.error is None, result.error
    return {(a.obj["apiVersion"].rpartition("/")[0], a.obj["kind"])
            for a in result.actions if a.obj is not None}  # fmt: skip


@pytest.mark.skipif(HELM is None, reason="helm not found: run helm/install-helm.sh")
@pytest.mark.parametrize(
    ("values", "namespace"), [("gpu-values.yaml", "default"), ("full-values.yaml", "serving")]
)
def test_operator_may_write_every_child_kind(chart, values, namespace):  # noqa: F811
    objs = render(chart, CHART_DIR / "ci" / values)
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    kinds = _applied_kinds(cr)
    assert {k for _, k in kinds} >= {"RayService", "ServiceMonitor", "PodMonitor"}
    rules = operator_rules(objs, namespace)
    for group, kind in kinds:
        for verb in ("get", "create", "patch", "delete"):
            assert any(_allows(x, group, PLURALS[kind], verb) for x in rules), (
                f"{namespace}: no {verb} on {group or 'core'} {PLURALS[kind]}"
            )

"""The chart's RBAC grants what the operator's children need (issue 28 item 4).

Children carry an owner reference with `blockOwnerDeletion: true` to their AgentServe.
Where the OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened
clusters), setting it needs `update` on the owner's `finalizers` subresource: without it
every child write is refused. Checked on the RBAC the chart renders, for the children the
operator really writes from the chart's own AgentServe, cluster-wide and namespaced.
"""

from __future__ import annotations

from typing import Any

import pytest
from agentserve_operator import resource as r
from agentserve_operator.chart import CHART_DIR
from agentserve_operator.fake import FakeCluster
from agentserve_operator.reconcile import reconcile
from operator_cases import allow_references
from test_helm import HELM, chart, render  # noqa: F401  (chart: the fixture)

needs_helm = pytest.mark.skipif(HELM is None, reason="helm not found: run helm/install-helm.sh")

SA_NAME = "rel-agentserve"  # the release fullname: `helm template rel`


def _allows(rule: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    def has(key: str, want: str) -> bool:
        values = rule.get(key) or []
        return want in values or "*" in values

    return has("apiGroups", group) and has("resources", resource) and has("verbs", verb)


def operator_rules(objs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The rules the operator's ServiceAccount holds in `namespace`: ClusterRoles bound by a
    ClusterRoleBinding, and Roles (or ClusterRoles) bound by a RoleBinding there."""

    def bound(binding: dict[str, Any]) -> bool:
        return any(s.get("kind") == "ServiceAccount" and s.get("name") == SA_NAME
                   for s in binding.get("subjects") or [])  # fmt: skip

    def role(kind: str, name: str, ns: str | None) -> list[dict[str, Any]]:
        return [rule for o in objs if o["kind"] == kind and o["metadata"]["name"] == name
                and (ns is None or o["metadata"].get("namespace") == ns)
                for rule in o.get("rules") or []]  # fmt: skip

    rules = []
    for b in objs:
        if b["kind"] == "ClusterRoleBinding" and bound(b):
            rules += role("ClusterRole", b["roleRef"]["name"], None)
        if b["kind"] == "RoleBinding" and bound(b) and b["metadata"].get("namespace") == namespace:
            kind = b["roleRef"]["kind"]
            rules += role(kind, b["roleRef"]["name"], namespace if kind == "Role" else None)
    return rules


def blocking_owners(cr: dict[str, Any]) -> set[tuple[str, str]]:
    """(API group, kind) of every owner a child of `cr` names with blockOwnerDeletion."""
    cluster = FakeCluster()
    secret = cr["spec"]["kubernetes"]["api_key_secret"]
    tenants = [t["name"] for t in cr["spec"]["tenants"]]
    cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
                 "stringData": {t: f"sk-{t}" for t in tenants}})  # fmt: skip
    allow_references(cluster, cr)
    result = reconcile(cluster, cluster.put(cr), "2030-01-01T00:00:00Z")
    assert result.error is None, result.error
    owners = {
        (ref["apiVersion"].split("/")[0], ref["kind"])
        for action in result.actions if action.obj is not None
        for ref in action.obj["metadata"].get("ownerReferences") or []
        if ref.get("blockOwnerDeletion")
    }  # fmt: skip
    assert owners, "no child blocks its owner's deletion: nothing to check"
    return owners


@needs_helm
@pytest.mark.parametrize(
    ("values", "namespaces"),
    [("gpu-values.yaml", ["default"]), ("full-values.yaml", ["serving"])],
)
def test_operator_may_set_block_owner_deletion_on_its_children(chart, values, namespaces):  # noqa: F811
    objs = render(chart, CHART_DIR / "ci" / values)
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    plural = {r.KIND: r.PLURAL}
    for group, kind in blocking_owners(cr):
        assert kind in plural, f"children name an owner of kind {kind} the chart does not own"
        for ns in namespaces:
            rules = operator_rules(objs, ns)
            assert rules, f"no RBAC for the operator in {ns}"
            assert any(_allows(x, group, f"{plural[kind]}/finalizers", "update") for x in rules), (
                f"{ns}: no update on {group} {plural[kind]}/finalizers (blockOwnerDeletion)"
            )


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"apiGroups": ["agentserve.dev"], "resources": ["agentserves/finalizers"],
          "verbs": ["update"]}, True),
        ({"apiGroups": ["agentserve.dev"], "resources": ["agentserves"], "verbs": ["update"]},
         False),
        ({"apiGroups": ["agentserve.dev"], "resources": ["agentserves/finalizers"],
          "verbs": ["patch"]}, False),
        ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, True),
    ],
)  # fmt: skip
def test_rule_matching(rule, expected):
    assert _allows(rule, "agentserve.dev", "agentserves/finalizers", "update") is expected

"""The chart's watched namespaces always include its own AgentServe's, and Phoenix (no
auth) is reachable only from the Ray pods and listed ingress namespaces (issue 30 item 12)."""

from __future__ import annotations

import pytest
import test_helm
from agentserve_operator import manifests as m
from test_helm import CHART_DIR, HELM, render

chart = test_helm.chart  # the fixture
kv = pytest.importorskip("kubernetes_validate")
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not found")
FULL = CHART_DIR / "ci" / "full-values.yaml"


def _watched(objs) -> list[str]:
    [deploy] = [o for o in objs
                if o["kind"] == "Deployment" and "operator" in o["metadata"]["name"]]  # fmt: skip
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a.split("=", 1)[1] for a in args if a.startswith("--namespace=")] + [
        "*" for a in args if a == "--all-namespaces"
    ]


def _roles(objs) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["namespace"]) for o in objs
            if o["kind"] in ("Role", "RoleBinding")}  # fmt: skip


def test_the_chart_watches_the_namespace_of_its_own_agentserve(chart):
    objs = render(chart, FULL, "--namespace", "ai")  # full-values watches [serving]
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    assert cr["metadata"]["namespace"] == "ai"
    assert _watched(objs) == ["serving", "ai"]
    assert _roles(objs) == {(k, ns) for k in ("Role", "RoleBinding") for ns in ("serving", "ai")}
    same = render(chart, FULL, "--namespace", "serving")
    assert _watched(same) == ["serving"]  # listed already: not twice


def test_without_its_own_agentserve_only_the_listed_namespaces_are_watched(chart):
    values = CHART_DIR / "ci" / "default-values.yaml"
    objs = render(chart, values, "--namespace", "ai", "--set", "operator.watchNamespaces={x}")
    assert _watched(objs) == ["x"] and _roles(objs) == {("Role", "x"), ("RoleBinding", "x")}
    assert _watched(render(chart, FULL, "--set", "operator.watchNamespaces=null")) == ["*"]


def _phoenix_policy(objs):
    return [o for o in objs if o["kind"] == "NetworkPolicy" and "phoenix" in o["metadata"]["name"]]


def test_phoenix_is_reachable_only_from_the_ray_pods_and_listed_namespaces(chart):
    objs = render(chart, FULL)
    [policy] = _phoenix_policy(objs)
    kv.validate(policy, "1.30", strict=True)
    [deploy] = [o for o in objs if o["kind"] == "Deployment" and "phoenix" in o["metadata"]["name"]]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    [ray] = policy["spec"]["ingress"]  # no ingressNamespaces: the Ray pods only
    # the labels every Ray pod of an AgentServe carries (the operator's manifests)
    assert ray["from"] == [{"podSelector": {"matchLabels": {m.LABEL_COMPONENT: "ray"}}}]
    assert {p["port"] for p in ray["ports"]} == {4317, 6006}

    listed = render(chart, FULL, "--set", "phoenix.networkPolicy.ingressNamespaces={ingress-nginx}")
    [_, ui] = _phoenix_policy(listed)[0]["spec"]["ingress"]
    assert ui["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    ]
    assert [p["port"] for p in ui["ports"]] == [6006]
    assert not _phoenix_policy(render(chart, FULL, "--set", "phoenix.networkPolicy.enabled=false"))

"""Which KubeRay operator pods the Ray pods' NetworkPolicy admits to the dashboard ports:
KubeRay installed by its Helm chart and by its kustomize manifests (issue 30 item 6)."""

from __future__ import annotations

import copy

import pytest
import test_helm
from agentserve_operator.resource import InvalidResource
from operator_cases import GPU_CR
from test_helm import CHART_DIR, HELM, render
from test_manifests import KEYS, by_kind, desired

chart = test_helm.chart  # the fixture

# The labels of KubeRay's operator pod, v1.4.2 to v1.6.2 (github.com/ray-project/kuberay):
# helm-chart/kuberay-operator/templates/deployment.yaml (release "kuberay-operator"), and
# ray-operator/config/manager/manager.yaml + kustomization.yaml (`kubectl apply -k
# ray-operator/config/default`).
HELM_INSTALL = {
    "app.kubernetes.io/name": "kuberay-operator",
    "app.kubernetes.io/instance": "kuberay-operator",
    "app.kubernetes.io/component": "kuberay-operator",
}
KUSTOMIZE_INSTALL = {
    "app.kubernetes.io/name": "kuberay",
    "app.kubernetes.io/component": "kuberay-operator",
}


def _kuberay_peer(d=None) -> dict:
    [peer] = by_kind(d or desired())["NetworkPolicy"]["spec"]["ingress"][2]["from"]
    return peer


def _with_kube(**kube) -> dict:
    cr = copy.deepcopy(GPU_CR)
    cr["metadata"]["uid"] = "u-1"
    cr["spec"].setdefault("kubernetes", {}).update(kube)
    return cr


@pytest.mark.parametrize("pod_labels", [HELM_INSTALL, KUSTOMIZE_INSTALL], ids=["helm", "kustomize"])
def test_default_selector_admits_kuberay_of_either_install(pod_labels):
    selector = _kuberay_peer()["podSelector"]["matchLabels"]
    assert selector and selector.items() <= pod_labels.items()


def test_other_pods_of_kuberays_namespace_are_not_admitted():
    selector = _kuberay_peer()["podSelector"]["matchLabels"]
    assert not selector.items() <= {"app.kubernetes.io/name": "kuberay-apiserver"}.items()
    assert _kuberay_peer()["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}
    }


def test_selector_is_configurable_and_never_empty():
    from agentserve_operator.resource import desired_from_cr

    labels = {"app": "my-kuberay", "team": "ray"}
    d = desired_from_cr(_with_kube(kuberay_operator_labels=labels), KEYS)
    assert _kuberay_peer(d)["podSelector"] == {"matchLabels": labels}
    for bad in ({}, {"app": "not a label value"}):  # {} would admit every pod there
        with pytest.raises(InvalidResource, match="kuberay_operator_labels"):
            desired_from_cr(_with_kube(kuberay_operator_labels=bad), KEYS)


@pytest.mark.skipif(HELM is None, reason="helm not found")
def test_chart_passes_the_selector_through(chart):
    values = CHART_DIR / "ci" / "gpu-values.yaml"
    given = "agentServe.spec.kubernetes.kuberay_operator_labels.app\\.kubernetes\\.io/name=kuberay"
    [cr] = [o for o in render(chart, values, "--set", given) if o["kind"] == "AgentServe"]
    labels = cr["spec"]["kubernetes"]["kuberay_operator_labels"]
    assert labels == {"app.kubernetes.io/name": "kuberay"}

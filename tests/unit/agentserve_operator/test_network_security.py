"""Who can reach what on a cluster: Ray token auth, the Ray pods' NetworkPolicy (which keeps
the 0.0.0.0 dashboard private), pod security, tokens, and namespaced RBAC."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
import test_helm
from agentserve_operator import manifests as m
from agentserve_operator.resource import KUBERAY_OPERATOR_LABELS
from operator_cases import GPU_CR
from test_helm import CHART_DIR, HELM, render
from test_manifests import by_kind, desired

chart = test_helm.chart  # the fixture

kv = pytest.importorskip("kubernetes_validate")


def _cluster():
    return by_kind()["RayService"]["spec"]["rayClusterConfig"]


def test_ray_token_auth_and_a_dashboard_the_probes_reach():
    """The dashboard and its agent bind 0.0.0.0: KubeRay's probes exec wget against
    localhost in the pod (tests/integration/test_kuberay_probes.py runs them on a real head);
    token auth (KubeRay >= 1.5) and the NetworkPolicy (below) keep them private."""
    cluster = _cluster()
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay makes the token Secret
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert head["rayStartParams"]["dashboard-agent-listen-port"] == "52365"
    assert "RAY_AUTH_TOKEN" not in str(cluster)  # never in the manifests


def test_ray_pods_run_with_seccomp_and_without_a_service_account_token():
    """No Ray container holds a token; the head's autoscaler sidecar (in-tree autoscaling,
    which scales the worker groups) gets one mounted where Ray's KubeRay node provider
    reads it."""
    cluster = _cluster()
    assert cluster["enableInTreeAutoscaling"] is True
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        pod = group["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        # a fresh block volume's root-owned root becomes writable by the images' user
        assert pod["securityContext"]["fsGroup"] == 100
        for container in pod["containers"]:
            assert "serviceaccount" not in str(container["volumeMounts"])
        kv.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod},
                    "1.30", strict=True)  # fmt: skip
    # the sidecar holding the token is as locked down as the Ray containers (PodSecurity
    # "restricted" rejects the head pod otherwise)
    sidecar = cluster["autoscalerOptions"]["securityContext"]
    assert sidecar == groups[0]["template"]["spec"]["containers"][0]["securityContext"]
    assert sidecar["capabilities"]["drop"] == ["ALL"] and sidecar["runAsNonRoot"] is True
    [mount] = cluster["autoscalerOptions"]["volumeMounts"]
    # where Ray's KubeRay node provider reads the token (not a copy of the path)
    from ray.autoscaler._private.kuberay.node_provider import IN_CLUSTER_TOKEN_PATH

    assert mount["mountPath"] == str(PurePosixPath(IN_CLUSTER_TOKEN_PATH).parent)
    head_volumes = {v["name"]: v for v in cluster["headGroupSpec"]["template"]["spec"]["volumes"]}
    sources = head_volumes[mount["name"]]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"] == {"path": "token", "expirationSeconds": 3607}
    assert sources[1]["configMap"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert sources[2]["downwardAPI"]["items"][0]["path"] == "namespace"
    worker_volumes = str(cluster["workerGroupSpecs"][0]["template"]["spec"]["volumes"])
    assert "serviceAccountToken" not in worker_volumes


def test_the_autoscaler_reads_the_token_where_it_is_mounted():
    """The mount path is the one Ray's KubeRay node provider reads (a rename in Ray would
    leave the autoscaler without credentials)."""
    from ray.autoscaler._private.kuberay import node_provider as provider

    [mount] = _cluster()["autoscalerOptions"]["volumeMounts"]
    assert mount["mountPath"] + "/token" == provider.IN_CLUSTER_TOKEN_PATH
    assert mount["mountPath"] + "/ca.crt" == provider.IN_CLUSTER_CA_CERT_PATH


def test_network_policy_admits_the_api_everyone_and_ray_ports_only_to_ray_pods():
    d = desired()
    policy = by_kind(d)["NetworkPolicy"]
    kv.validate(policy, "1.30", strict=True)
    spec = policy["spec"]
    ray_pods = {m.LABEL_DEPLOYMENT: d.name, m.LABEL_COMPONENT: "ray"}
    assert spec["podSelector"] == {"matchLabels": ray_pods} and spec["policyTypes"] == ["Ingress"]
    # every Ray pod carries the labels the policy selects
    cluster = _cluster()
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert ray_pods.items() <= group["template"]["metadata"]["labels"].items()
    api, admin, kuberay, internal = spec["ingress"]
    assert api == {"ports": [{"protocol": "TCP", "port": d.spec.server.port}]}  # no `from`
    metrics = d.spec.server.metrics_port  # and the second ingress replica's, one above
    assert {p["port"] for p in admin["ports"]} == {metrics, metrics + 1, 8080}
    assert admin["from"] == [{"namespaceSelector": {}}]  # pods of the cluster only
    assert {p["port"] for p in kuberay["ports"]} == {8265, 52365}
    # KubeRay's operator pods in KubeRay's namespace only (one peer: both selectors must
    # match): a pod labelled kuberay-operator elsewhere must not reach the dashboard, which
    # has no auth on KubeRay 1.4 (job submission = code execution)
    namespace = {"kubernetes.io/metadata.name": d.kube.kuberay_namespace}
    assert d.kube.kuberay_namespace == "kuberay-system"
    peer = {"namespaceSelector": {"matchLabels": namespace},
            "podSelector": {"matchLabels": KUBERAY_OPERATOR_LABELS}}  # fmt: skip
    assert kuberay["from"] == [peer]
    assert internal == {"from": [{"podSelector": {"matchLabels": ray_pods}}]}
    open_to_all = {p["port"] for rule in spec["ingress"] if "from" not in rule
                   for p in rule["ports"]}  # fmt: skip
    assert open_to_all == {d.spec.server.port}  # not 6379, 8265, 10001


def test_monitoring_namespaces_limit_who_scrapes_the_admin_ports():
    """Issue 64 item 6: /metrics (tenant names) and /status only to the given namespaces."""
    kube = {**GPU_CR["spec"].get("kubernetes", {}), "monitoring_namespaces": ["monitoring"]}
    cr = {**GPU_CR, "spec": {**GPU_CR["spec"], "kubernetes": kube}}
    policy = by_kind(desired(cr))["NetworkPolicy"]
    kv.validate(policy, "1.30", strict=True)
    _, admin, _, _ = policy["spec"]["ingress"]
    match = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}
    assert admin["from"] == [{"namespaceSelector": {"matchExpressions": [match]}}]


pytestmark_helm = pytest.mark.skipif(HELM is None, reason="helm not found")


@pytestmark_helm
def test_watch_namespaces_gives_namespaced_roles(chart):
    values = CHART_DIR / "ci" / "default-values.yaml"
    objs = render(chart, values, "--set", "operator.watchNamespaces={team-a,team-b}")
    for obj in objs:
        if obj["apiVersion"].startswith("rbac") or obj["kind"] == "NetworkPolicy":
            kv.validate(obj, "1.30", strict=True)
    roles = {(o["kind"], o["metadata"].get("namespace")) for o in objs if "Role" in o["kind"]}
    assert roles == {("ClusterRole", None), ("ClusterRoleBinding", None),
                     ("Role", "team-a"), ("RoleBinding", "team-a"),
                     ("Role", "team-b"), ("RoleBinding", "team-b")}  # fmt: skip
    [cluster_role] = [o for o in objs if o["kind"] == "ClusterRole"]
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"]]
    [role, _] = [o for o in objs if o["kind"] == "Role"]
    assert ["networkpolicies"] in [r["resources"] for r in role["rules"]]
    everywhere = render(chart, values)  # no watchNamespaces: one ClusterRole, no Roles
    assert not [o for o in everywhere if o["kind"] in ("Role", "RoleBinding")]
    [wide] = [o for o in everywhere if o["kind"] == "ClusterRole"]
    assert ["agentserves"] in [r["resources"] for r in wide["rules"]]


@pytestmark_helm
def test_chart_network_policy_for_the_operator(chart):
    objs = render(chart, CHART_DIR / "ci" / "default-values.yaml")
    [policy] = [o for o in objs if o["kind"] == "NetworkPolicy"]
    kv.validate(policy, "1.30", strict=True)
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {}}]
    assert {p["port"] for p in rule["ports"]} == {9090, 8080}
    given = "networkPolicy.monitoringNamespaces={monitoring,prom}"
    objs = render(chart, CHART_DIR / "ci" / "default-values.yaml", "--set", given)
    [policy] = [o for o in objs if o["kind"] == "NetworkPolicy"]
    kv.validate(policy, "1.30", strict=True)
    [rule] = policy["spec"]["ingress"]
    match = {"key": "kubernetes.io/metadata.name", "operator": "In",
             "values": ["monitoring", "prom"]}  # fmt: skip
    assert rule["from"] == [{"namespaceSelector": {"matchExpressions": [match]}}]


@pytestmark_helm
def test_chart_admits_kuberay_from_the_namespace_given(chart):
    """KubeRay is installed on its own: the AgentServe keeps the spec default
    (kuberay-system) whatever the release namespace, or the value given."""
    values = CHART_DIR / "ci" / "gpu-values.yaml"  # no kuberay_namespace set

    def kube(*sets: str) -> dict:
        [cr] = [o for o in render(chart, values, *sets) if o["kind"] == "AgentServe"]
        return cr["spec"]["kubernetes"]

    assert "kuberay_namespace" not in kube("--namespace", "ai")
    given = ("--set", "agentServe.spec.kubernetes.kuberay_namespace=ray-ops")
    assert kube("--namespace", "ai", *given)["kuberay_namespace"] == "ray-ops"

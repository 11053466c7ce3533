"""observe -> plan -> apply -> status end to end against the fake API, and the kopf handlers."""

from __future__ import annotations

import logging

import kopf
import pytest
from agentserve_operator import manifests as m
from agentserve_operator.handlers import run_reconcile
from agentserve_operator.metrics import OperatorMetrics
from agentserve_operator.reconcile import MONITORING_CRD, reconcile
from operator_cases import GPU_CR

T0, T1, T2 = "2030-01-01T00:00:00Z", "2030-01-01T00:00:30Z", "2030-01-01T00:01:00Z"
LOG = logging.getLogger("test")


def cr(cluster):
    return cluster.find("AgentServe", "demo")


def conditions(cluster):
    return {c["type"]: (c["status"], c["reason"]) for c in cr(cluster)["status"]["conditions"]}


def make_ready(cluster, ready_pods=1):
    """Play KubeRay: mark the RayService ready and start worker pods."""
    rs = cluster.find("RayService", "demo")
    group = m.worker_group_name("qwen3-8b")
    rs["status"] = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "activeServiceStatus": {"rayClusterName": "demo-raycluster-1",
                                "applicationStatuses": {"demo": {
            "status": "RUNNING",
            "serveDeploymentStatuses": {"model-qwen3-8b": {"status": "HEALTHY"}}}}},
    }  # fmt: skip
    for i in range(ready_pods):
        labels = {
            m.LABEL_DEPLOYMENT: "demo",
            m.LABEL_MODEL: group,
            "ray.io/cluster": "demo-raycluster-1",
        }
        cluster.put({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"w{i}", "labels": labels},
                     "status": {"phase": "Running",
                                "conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip


def test_create_then_ready_then_idempotent(cluster):
    first = reconcile(cluster, cr(cluster), T0)
    kinds = [a.ref.kind for a in first.actions]
    assert kinds == ["ConfigMap", "NetworkPolicy", "RayService", "Service",  # -openai: KubeRay
                     "PodDisruptionBudget"]  # fmt: skip
    assert conditions(cluster)["Progressing"] == ("True", "Applied")
    make_ready(cluster)
    second = reconcile(cluster, cr(cluster), T1)
    assert second.actions == []
    status = cr(cluster)["status"]
    assert conditions(cluster) == {
        "Ready": ("True", "Serving"),
        "Progressing": ("False", "Stable"),
        "Degraded": ("False", "AsExpected"),
    }
    assert status["endpoint"] == "http://demo-openai.default.svc:8000/v1"
    assert status["models"][0]["readyReplicas"] == 1
    assert status["models"][0]["deploymentStatus"] == "HEALTHY"
    assert status["readyReplicas"] == "1/1-4" and status["observedGeneration"] == 1
    writes = len([c for c in cluster.calls if c[0] in ("apply", "patch-status", "delete")])
    third = reconcile(cluster, cr(cluster), T2)
    assert third.actions == []
    assert len([c for c in cluster.calls if c[0] in ("apply", "patch-status", "delete")]) == writes


def test_deleted_child_is_recreated(cluster):
    reconcile(cluster, cr(cluster), T0)
    cluster.delete(cluster_ref(cluster, "Service", "demo-admin"))
    result = reconcile(cluster, cr(cluster), T1)
    assert [(a.ref.kind, a.reason) for a in result.actions] == [("Service", "missing")]
    assert cluster.find("Service", "demo-admin") is not None


def test_manual_edit_of_managed_field_is_reverted(cluster):
    reconcile(cluster, cr(cluster), T0)
    rs = cluster.find("RayService", "demo")
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = 99
    rs["metadata"]["annotations"] = {"team": "ml"}  # not managed: stays
    result = reconcile(cluster, cr(cluster), T1)
    assert [(a.ref.kind, a.reason) for a in result.actions] == [("RayService", "drift")]
    rs = cluster.find("RayService", "demo")
    assert rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] == 4
    assert rs["metadata"]["annotations"] == {"team": "ml"}


def test_spec_update_scales_and_bumps_generation(cluster):
    reconcile(cluster, cr(cluster), T0)
    body = cr(cluster)
    body["spec"]["models"][0]["replicas"]["max_replicas"] = 8
    body["metadata"]["generation"] = 2
    result = reconcile(cluster, body, T1)
    assert [a.ref.kind for a in result.actions] == ["ConfigMap", "RayService"]
    assert cr(cluster)["status"]["observedGeneration"] == 2


def test_servicemonitor_follows_the_prometheus_crd(cluster):
    reconcile(cluster, cr(cluster), T0)
    assert cluster.find("ServiceMonitor", "demo") is None
    # kinds the API server does not serve are not even looked up (each miss would rerun
    # the dynamic client's API discovery, every reconcile)
    monitors = ("ServiceMonitor/", "PodMonitor/")
    assert not [c for c in cluster.calls if c[0] == "get" and c[1].startswith(monitors)]
    cluster.crds.add(MONITORING_CRD)
    reconcile(cluster, cr(cluster), T1)
    assert cluster.find("ServiceMonitor", "demo") is not None
    body = cr(cluster)
    body["spec"]["kubernetes"]["monitoring"] = False
    result = reconcile(cluster, body, T2)
    deleted = [(a.verb, a.ref.kind) for a in result.actions]
    assert deleted == [("delete", "ServiceMonitor"), ("delete", "PodMonitor")]


def test_invalid_spec_keeps_children_and_reports_once(cluster):
    reconcile(cluster, cr(cluster), T0)
    before = sorted(cluster.kinds())
    body = cr(cluster)
    body["spec"]["models"][0]["replicas"]["min_replicas"] = 9
    result = reconcile(cluster, body, T1)
    assert result.error is not None and result.actions == []
    assert "min_replicas (9) must be <= max_replicas (4)" in str(result.error)
    assert sorted(cluster.kinds()) == before
    assert conditions(cluster)["Degraded"] == ("True", "InvalidSpec")
    reconcile(cluster, cr(cluster) | {"spec": body["spec"]}, T2)
    assert [e[1] for e in cluster.events] == ["InvalidSpec"]  # not one per retry


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tenants": []}, "needs at least one tenant"),
        ({"tenants": [{"name": "bob", "sla": {}}]}, "has no key named 'bob'"),
        ({"kubernetes": {"api_key_secret": "nope"}}, "Secret 'nope' not found"),
        ({"kubernetes": {"image_pull_policy": "Sometimes"}}, "kubernetes.image_pull_policy"),
        ({"models": [{"source": "Qwen/Qwen3/8B"}]}, "neither the bundled model"),
    ],
)
def test_invalid_specs_name_the_problem(cluster, change, message):
    body = cr(cluster)
    body["spec"].update(change)
    result = reconcile(cluster, body, T0)
    assert message in str(result.error)
    assert message in conditions_message(cluster)


def conditions_message(cluster):
    return next(c["message"] for c in cr(cluster)["status"]["conditions"] if c["type"] == "Ready")


def test_deleting_the_cr_garbage_collects_children(cluster):
    reconcile(cluster, cr(cluster), T0)
    cluster.delete(cluster_ref(cluster, "AgentServe", "demo"))
    assert cluster.kinds() == ["PersistentVolumeClaim", "Secret"]  # the user's (the salt: GC)


def cluster_ref(cluster, kind, name):
    from agentserve_operator.plan import ObjectRef

    return ObjectRef.of(cluster.find(kind, name))


# -- kopf handlers ---------------------------------------------------------------------


def test_handler_maps_api_failure_to_temporary_error(cluster):
    metrics = OperatorMetrics()
    cluster.failures.append("apply")
    with pytest.raises(kopf.TemporaryError):
        run_reconcile(cluster, metrics, cr(cluster), LOG)
    run_reconcile(cluster, metrics, cr(cluster), LOG)  # the retry succeeds
    assert cluster.find("RayService", "demo") is not None
    samples = {s.labels["outcome"]: s.value for s in metrics.reconciles.collect()[0].samples
               if s.name.endswith("_total")}  # fmt: skip
    assert samples == {"retry": 1.0, "ok": 1.0}


def test_change_handler_raises_permanent_error_for_invalid_spec(cluster):
    from agentserve_operator import handlers

    body = cr(cluster)
    body["spec"]["tenants"] = []
    memo = kopf.Memo(cluster=cluster, metrics=OperatorMetrics())
    with pytest.raises(kopf.PermanentError, match="tenant"):
        handlers._on_change(body=body, memo=memo, logger=LOG)
    handlers._resync(body=body, memo=memo, logger=LOG)  # the timer logs, never raises


def test_handlers_create_ready_update_delete_through_kopf_entry_points(cluster):
    from agentserve_operator import handlers

    memo = kopf.Memo(cluster=cluster, metrics=OperatorMetrics())
    handlers._on_change(body=cr(cluster), memo=memo, logger=LOG)
    make_ready(cluster)
    handlers._resync(body=cr(cluster), memo=memo, logger=LOG)
    assert conditions(cluster)["Ready"] == ("True", "Serving")
    body = cr(cluster)
    body["spec"]["models"][0]["drafter"]["enabled"] = False
    handlers._on_change(body=body, memo=memo, logger=LOG)
    assert "enabled: false" in cluster.find("RayService", "demo")["spec"]["serveConfigV2"]
    cluster.delete(cluster_ref(cluster, "AgentServe", "demo"))
    # pods belong to KubeRay's RayCluster; the claim and key Secret to the user
    assert cluster.kinds() == ["PersistentVolumeClaim", "Pod", "Secret"]


def test_example_cr_is_the_one_in_operator_cases():
    assert GPU_CR["metadata"]["name"] == "demo"


def test_an_openai_service_this_operator_made_before_is_handed_to_kuberay(cluster):
    """Operators before issue 28 made <name>-openai themselves (selecting both clusters of
    an upgrade); now it is the RayService's serveService: the old one is deleted as stale,
    one that KubeRay owns is left alone."""
    body = cr(cluster)
    old = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "demo-openai",
            "namespace": "default",
            "ownerReferences": [
                {"uid": body["metadata"]["uid"], "kind": "AgentServe", "name": "demo"}
            ],
        },
    }
    cluster.put(old)  # fmt: skip
    result = reconcile(cluster, body, T0)
    assert ("delete", "Service", "demo-openai") in [
        (a.verb, a.ref.kind, a.ref.name) for a in result.actions
    ]
    old["metadata"]["ownerReferences"] = [{"uid": "rayservice-uid", "kind": "RayService"}]
    cluster.put(old)
    assert reconcile(cluster, cr(cluster), T1).actions == []

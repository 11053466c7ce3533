"""Upgrades that never double the GPUs, the workers' PodDisruptionBudget and GCS fault
tolerance (issue 62, Kubernetes fixes): rendered per KubeRay version and validated against
its published CRD; a strategy the cluster cannot carry out is refused with the reason."""

from __future__ import annotations

import kuberay_crds
import pytest
from agentserve_operator import kuberay as kr
from agentserve_operator.reconcile import reconcile
from operator_cases import gpu_cr
from test_manifests import by_kind, desired, kv
from test_reconcile import T0, conditions, conditions_message, cr

GATEWAY = {"gateway_class_name": "istio", "max_surge_percent": 25}


def _rayservice(version: str, **kube) -> dict:
    body = gpu_cr()
    body["spec"]["kubernetes"].update(kube)
    rs = by_kind(desired(body), kuberay=kr.KubeRay(version))["RayService"]
    kuberay_crds.validate(rs, version)
    return rs


@pytest.mark.parametrize("version", kr.SUPPORTED)
def test_default_strategy_never_runs_a_second_full_cluster(version):
    """Was NewCluster: every change under the Ray cluster doubled the GPUs."""
    assert _rayservice(version)["spec"]["upgradeStrategy"] == {"type": "None"}


@pytest.mark.parametrize("version", ["1.5", "1.6"])
def test_default_is_incremental_on_kuberay_15_with_a_gateway_class(version):
    strategy = _rayservice(version, incremental_upgrade=GATEWAY)["spec"]["upgradeStrategy"]
    assert strategy == {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {"gatewayClassName": "istio", "maxSurgePercent": 25,
                                  "stepSizePercent": 10, "intervalSeconds": 30},
    }  # fmt: skip


def test_kuberay_14_gets_none_even_with_a_gateway_class():
    """1.4 has no incremental upgrade (its CRD has no clusterUpgradeOptions)."""
    strategy = _rayservice("1.4", incremental_upgrade=GATEWAY)["spec"]["upgradeStrategy"]
    assert strategy == {"type": "None"}


@pytest.mark.parametrize("strategy", ["NewCluster", "None"])
def test_an_explicit_strategy_is_kept(strategy):
    for version in kr.SUPPORTED:
        assert _rayservice(version, upgrade_strategy=strategy)["spec"]["upgradeStrategy"] == {
            "type": strategy}  # fmt: skip


def _hub_claim(cluster, modes):
    cluster.find("PersistentVolumeClaim", "models")["spec"] = {"accessModes": modes}


@pytest.mark.parametrize(
    ("modes", "strategy", "refused"),
    [(["ReadWriteOnce"], "NewCluster", True),
     (["ReadWriteOncePod"], "NewCluster", True),
     (["ReadWriteOnce"], "None", False),
     (["ReadWriteOnce"], "auto", False),  # auto without a gateway class: None
     (["ReadWriteMany"], "NewCluster", False),
     (["ReadWriteOnce", "ReadWriteMany"], "NewCluster", False)],
)  # fmt: skip
def test_a_single_node_hub_cache_refuses_two_clusters_at_once(cluster, modes, strategy, refused):
    """Example 05's ReadWriteOnce cache under NewCluster: the new cluster's workers hit
    Multi-Attach and the upgrade never completes. Refused, saying what to change."""
    _hub_claim(cluster, modes)
    body = cr(cluster)
    body["spec"]["kubernetes"].update(
        hub_cache={"claim_name": "models"}, upgrade_strategy=strategy, kuberay_version="1.6"
    )
    result = reconcile(cluster, body, T0)
    assert (result.error is not None) == refused
    if refused:
        assert conditions(cluster)["Degraded"] == ("True", "InvalidSpec")
        assert "ReadWriteMany" in conditions_message(cluster)
        assert "Multi-Attach" in conditions_message(cluster)


def test_incremental_is_refused_on_kuberay_14_and_without_its_settings(cluster):
    body = cr(cluster)
    body["spec"]["kubernetes"].update(
        upgrade_strategy="NewClusterWithIncrementalUpgrade", kuberay_version="1.4"
    )
    assert reconcile(cluster, body, T0).error is not None
    message = conditions_message(cluster)
    assert "needs KubeRay >= 1.5" in message and "kubernetes.incremental_upgrade" in message


def test_workers_get_a_disruption_budget():
    pdb = by_kind()["PodDisruptionBudget"]
    kv.validate(pdb, "1.30", strict=True)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["ray.io/node-type"] == "worker"
    [expr] = pdb["spec"]["selector"]["matchExpressions"]
    assert expr["values"] == [by_kind()["RayService"]["spec"]["rayClusterConfig"][
        "workerGroupSpecs"][0]["groupName"]]  # fmt: skip
    body = gpu_cr()
    body["spec"]["kubernetes"]["worker_max_unavailable"] = None
    assert "PodDisruptionBudget" not in by_kind(desired(body))


def test_replicas_spread_over_pods_are_not_in_the_budget():
    """Their non-serving pods are never Ready, which a budget counts as disrupted: it would
    refuse every eviction and block node drains."""
    body = gpu_cr()
    model = body["spec"]["models"][0]
    model["pipeline_parallel_size"] = 2
    model["replicas"].update(num_gpus=2, nodes_per_replica=2)
    assert "PodDisruptionBudget" not in by_kind(desired(body))


@pytest.mark.parametrize("version", kr.SUPPORTED)
def test_gcs_fault_tolerance_is_opt_in_with_the_password_from_a_secret(version):
    assert "gcsFaultToleranceOptions" not in _rayservice(version)["spec"]["rayClusterConfig"]
    ft = {"redis_address": "redis.redis.svc:6379", "redis_password_secret": "redis-auth",
          "external_storage_namespace": "demo"}  # fmt: skip
    cluster = _rayservice(version, gcs_fault_tolerance=ft)["spec"]["rayClusterConfig"]
    assert cluster["gcsFaultToleranceOptions"] == {
        "redisAddress": "redis.redis.svc:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis-auth",
                                                         "key": "password"}}},
        "externalStorageNamespace": "demo",
    }  # fmt: skip


def test_the_redis_password_secret_needs_the_label(cluster):
    body = cr(cluster)
    body["spec"]["kubernetes"]["gcs_fault_tolerance"] = {
        "redis_address": "redis:6379", "redis_password_secret": "redis-auth"}  # fmt: skip
    cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-auth"}})
    assert reconcile(cluster, body, T0).error is not None
    assert "gcs_fault_tolerance.redis_password_secret: Secret 'redis-auth' is not labelled" in (
        conditions_message(cluster))  # fmt: skip

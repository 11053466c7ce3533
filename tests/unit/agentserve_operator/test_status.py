"""Status columns (issue 28 item 9): ready replicas count serving replicas, not pods (a
TP x PP replica over several pods counts once), and no column shows a field nothing writes.
Table tests on the pure status functions."""

from __future__ import annotations

import pytest
from agentserve.serve.names import deployment_name
from agentserve_operator import manifests as m
from agentserve_operator import resource as r
from agentserve_operator.crd import crd_manifest
from agentserve_operator.status import Observation, compute_status, ready_replicas
from operator_cases import SECRET, gpu_cr

NOW = "2030-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("ready_pods", "running_pods", "nodes", "replicas"),
    [(0, 0, 1, 0), (1, 1, 1, 1), (3, 3, 1, 3), (2, 3, 1, 2),
     # a replica over N pods: only its own pod holds a Serve proxy, so only it is Ready
     # (KubeRay's worker readiness probe); the replica serves once all N pods run
     (0, 2, 2, 0), (1, 1, 2, 0), (1, 2, 2, 1), (1, 3, 2, 1), (2, 3, 2, 1), (2, 4, 2, 2),
     (2, 8, 4, 2), (2, 7, 4, 1), (3, 8, 4, 2)],
)  # fmt: skip
def test_ready_replicas_are_whole_replicas(ready_pods, running_pods, nodes, replicas):
    assert ready_replicas(ready_pods, running_pods, nodes) == replicas


def _desired(nodes: int, min_replicas: int, max_replicas: int) -> r.Desired:
    model = {
        "name": "big",
        "source": "/models/big",
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": nodes,
        "drafter": {"enabled": False},
        "replicas": {"num_gpus": 8 * nodes, "nodes_per_replica": nodes,
                     "min_replicas": min_replicas, "max_replicas": max_replicas},
    }  # fmt: skip
    cr = gpu_cr(models=[model])
    cr["metadata"].update(uid="uid-1", generation=1)
    return r.desired_from_cr(cr, SECRET["stringData"])


ACTIVE = "demo-raycluster-abcde"
R, r_, P = "ready", "running", "pending"  # pod states: Ready; Running, no proxy; Pending


def _pod(name: str, group: str, state: str, cluster: str = ACTIVE) -> dict:
    return {
        "metadata": {"name": name, "labels": {m.LABEL_MODEL: group, "ray.io/cluster": cluster}},
        "status": {
            "phase": "Pending" if state == P else "Running",
            "conditions": [{"type": "Ready", "status": str(state == R)}],
        },
    }


def _rayservice(active: str | None = ACTIVE, pending: str | None = None,
                deployment: str = "HEALTHY") -> dict:  # fmt: skip
    """KubeRay's RayService status: the app `demo`, model `big`'s deployment `deployment`."""
    status: dict = {"conditions": [{"type": "Ready", "status": "True"}]}
    if active:
        deployments = {deployment_name("big"): {"status": deployment}}
        apps = {"demo": {"status": "RUNNING", "serveDeploymentStatuses": deployments}}
        status["activeServiceStatus"] = {"rayClusterName": active, "applicationStatuses": apps}
    if pending:
        status["pendingServiceStatus"] = {"rayClusterName": pending}
    return {"status": status}


@pytest.mark.parametrize(
    ("nodes", "bounds", "pods", "column", "model_ready"),
    [
        (2, (1, 1), [R, r_], "1/1", 1),  # example 07: was "2/1"; its 2nd pod has no proxy
        (2, (1, 1), [R, P], "0/1", 0),  # half a pipeline serves nothing
        (2, (1, 1), [r_, r_], "0/1", 0),  # pods up, the replica not yet
        (2, (1, 3), [R, r_, R], "1/1-3", 1),
        (2, (1, 3), [R, r_, R, r_], "2/1-3", 2),
        (1, (1, 4), [R, R, r_], "2/1-4", 2),
        (4, (1, 2), [R, r_, r_, r_, R, r_, r_, r_], "2/1-2", 2),
    ],
)  # fmt: skip
def test_status_ready_column_counts_replicas(nodes, bounds, pods, column, model_ready):
    d = _desired(nodes, *bounds)
    group = m.worker_group_name("big")
    objs = [_pod(f"w{i}", group, state) for i, state in enumerate(pods)]
    objs.append(_pod("other", "another-group", R))  # another model's pod: not counted
    status = compute_status(d, Observation(_rayservice(), objs), 0, [], NOW)
    assert status["readyReplicas"] == column
    assert status["models"][0]["readyReplicas"] == model_ready


def test_only_the_active_clusters_pods_count_during_an_upgrade():
    """A NewCluster upgrade runs a second, pending Ray cluster beside the serving one: its
    pods serve nothing until KubeRay switches traffic (review of issue 28, item 5)."""
    d = _desired(1, 1, 4)
    group = m.worker_group_name("big")
    pods = [_pod("a0", group, R), _pod("a1", group, R)]
    pods += [_pod(f"p{i}", group, R, cluster="demo-raycluster-new") for i in range(2)]
    rs = _rayservice(pending="demo-raycluster-new")
    assert compute_status(d, Observation(rs, pods), 0, [], NOW)["readyReplicas"] == "2/1-4"
    # before KubeRay names an active cluster (first start-up), nothing serves yet
    assert compute_status(d, Observation(_rayservice(None), pods), 0, [], NOW)[
        "readyReplicas"] == "0/1-4"  # fmt: skip


def test_every_printer_column_reads_a_field_the_operator_writes():
    """A column over a status field nothing writes shows blanks for ever (was: SLA)."""
    d = _desired(1, 1, 1)
    pod = _pod("w0", m.worker_group_name("big"), R)
    written = compute_status(d, Observation(_rayservice(), [pod]), 0, [], NOW)
    columns = crd_manifest()["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        path = column["jsonPath"]
        if not path.startswith(".status."):
            continue
        top = path.removeprefix(".status.").split("[")[0].split(".")[0]
        assert top in written, f"column {column['name']} reads {path}: never written"


def _serve(**states: int) -> dict:
    """The ingress's GET /status body with model `big`'s replica states."""
    deployments = {deployment_name("big"): {"status": "UPSCALING", "replicas": states}}
    return {"applications": {"demo": {"status": "RUNNING", "deployments": deployments}}}


def test_a_replica_still_loading_is_not_ready():
    """Ray starts a worker's Serve proxy (which makes the pod Ready) for a STARTING replica:
    readyReplicas counts Serve's RUNNING replicas, not Ready pods (issue 62)."""
    d = _desired(1, 1, 4)
    group = m.worker_group_name("big")
    pods = [_pod(f"w{i}", group, R) for i in range(3)]
    obs = Observation(_rayservice(deployment="UPSCALING"), pods, _serve(RUNNING=1, STARTING=2))
    status = compute_status(d, obs, 0, [], NOW)
    assert status["models"][0]["readyReplicas"] == 1 and status["readyReplicas"] == "1/1-4"


@pytest.mark.parametrize(
    ("deployment", "previous", "ready"),
    [("HEALTHY", 0, 3),  # every replica Serve wants is RUNNING: the pods tell how many
     ("UPSCALING", 2, 2),  # the third Ready pod may hold a replica still loading
     ("UPDATING", 0, 0),  # first start: nothing known to serve yet
     ("UNHEALTHY", 5, 3)],
)  # fmt: skip
def test_without_serves_count_a_ready_pod_counts_only_when_serve_is_healthy(
    deployment, previous, ready
):
    d = _desired(1, 1, 4)
    pods = [_pod(f"w{i}", m.worker_group_name("big"), R) for i in range(3)]
    obs = Observation(_rayservice(deployment=deployment), pods, None, {"big": previous})
    assert compute_status(d, obs, 0, [], NOW)["models"][0]["readyReplicas"] == ready

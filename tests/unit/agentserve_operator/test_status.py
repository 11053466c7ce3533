"""Status columns (issue 28 item 9): ready replicas count serving replicas, not pods (a
TP x PP replica over several pods counts once), and no column shows a field nothing writes.
Table tests on the pure status functions."""

from __future__ import annotations

import pytest
from agentserve_operator import manifests as m
from agentserve_operator import resource as r
from agentserve_operator.crd import crd_manifest
from agentserve_operator.status import Observation, compute_status, ready_replicas
from operator_cases import SECRET, gpu_cr

NOW = "2030-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("ready_pods", "nodes", "replicas"),
    [(0, 1, 0), (1, 1, 1), (3, 1, 3), (0, 2, 0), (1, 2, 0), (2, 2, 1), (3, 2, 1), (4, 2, 2),
     (8, 4, 2), (7, 4, 1)],
)  # fmt: skip
def test_ready_replicas_are_whole_replicas(ready_pods, nodes, replicas):
    assert ready_replicas(ready_pods, nodes) == replicas


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


def _pod(name: str, group: str, ready: bool) -> dict:
    return {
        "metadata": {"name": name, "labels": {m.LABEL_MODEL: group}},
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }


@pytest.mark.parametrize(
    ("nodes", "bounds", "pods_ready", "column", "model_ready"),
    [
        (2, (1, 1), [True, True], "1/1", 1),  # example 07: was "2/1"
        (2, (1, 1), [True, False], "0/1", 0),  # half a pipeline serves nothing
        (2, (1, 3), [True, True, True], "1/1-3", 1),
        (2, (1, 3), [True] * 4, "2/1-3", 2),
        (1, (1, 4), [True, True, False], "2/1-4", 2),
        (4, (1, 2), [True] * 8, "2/1-2", 2),
    ],
)  # fmt: skip
def test_status_ready_column_counts_replicas(nodes, bounds, pods_ready, column, model_ready):
    d = _desired(nodes, *bounds)
    group = m.worker_group_name("big")
    pods = [_pod(f"w{i}", group, ok) for i, ok in enumerate(pods_ready)]
    pods.append(_pod("other", "another-group", True))  # another model's pod: not counted
    status = compute_status(d, Observation(None, pods), 0, [], NOW)
    assert status["readyReplicas"] == column
    assert status["models"][0]["readyReplicas"] == model_ready


def test_every_printer_column_reads_a_field_the_operator_writes():
    """A column over a status field nothing writes shows blanks for ever (was: SLA)."""
    d = _desired(1, 1, 1)
    pod = _pod("w0", m.worker_group_name("big"), True)
    rs = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    written = compute_status(d, Observation(rs, [pod]), 0, [], NOW)
    columns = crd_manifest()["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        path = column["jsonPath"]
        if not path.startswith(".status."):
            continue
        top = path.removeprefix(".status.").split("[")[0].split(".")[0]
        assert top in written, f"column {column['name']} reads {path}: never written"

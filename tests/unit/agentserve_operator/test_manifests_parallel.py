"""Worker groups and Serve placement of TP x PP replicas (one node, and pipelines over nodes)."""

from __future__ import annotations

import yaml
from agentserve_operator import manifests as m
from agentserve_operator.resource import desired_from_cr
from operator_cases import gpu_cr

KEYS = {"alice": "sk-alice-secret"}


def _rayservice(tp: int, pp: int, nodes: int, min_replicas: int = 1, max_replicas: int = 2):
    model = {
        "name": "big",
        "source": "/models/big",
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "replicas": {"num_gpus": tp * pp, "nodes_per_replica": nodes,
                     "min_replicas": min_replicas, "max_replicas": max_replicas},
    }  # fmt: skip
    d = desired_from_cr(gpu_cr(models=[model]), KEYS)
    [rs] = [o for o in m.children(d, monitoring_available=False) if o["kind"] == "RayService"]
    [group] = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    [deployment] = [
        x
        for x in yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["deployments"]
        if x["name"] == "model-big"
    ]
    return group, deployment


def test_tp8_worker_pod_holds_all_eight_gpus_of_a_replica():
    group, deployment = _rayservice(8, 1, 1)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[m.GPU] == "8" and group["rayStartParams"]["num-gpus"] == "8"
    assert (group["minReplicas"], group["maxReplicas"]) == (1, 2)
    bundles = deployment["placement_group_bundles"]
    assert len(bundles) == 8 and deployment["placement_group_strategy"] == "STRICT_PACK"
    assert {b[group["groupName"]] for b in bundles} == {0.125}
    assert deployment["ray_actor_options"]["num_gpus"] == 0


def test_pipeline_over_two_nodes_asks_for_two_pods_per_replica():
    group, deployment = _rayservice(8, 2, 2, min_replicas=1, max_replicas=3)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[m.GPU] == "8"  # a node holds one pipeline stage of TP 8
    assert (group["minReplicas"], group["maxReplicas"]) == (2, 6)  # pods = replicas x nodes
    assert len(deployment["placement_group_bundles"]) == 16
    assert deployment["placement_group_strategy"] == "PACK"
    pod_units = sum(b[group["groupName"]] for b in deployment["placement_group_bundles"])
    assert pod_units == 2  # the group resource of exactly two pods


def test_serve_config_has_no_yaml_aliases():
    import json

    model = {"name": "big", "source": "/models/big", "tensor_parallel_size": 4,
             "replicas": {"num_gpus": 4}}  # fmt: skip
    rs = m.rayservice(desired_from_cr(gpu_cr(models=[model]), KEYS))
    assert "&id" not in rs["spec"]["serveConfigV2"] and "*id" not in rs["spec"]["serveConfigV2"]
    json.dumps(rs)  # plain data only

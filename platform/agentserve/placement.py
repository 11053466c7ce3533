"""Where a model replica runs: Ray actor options and, for TP x PP > 1, its placement group.

Pure (no Ray import), shared by serve/app.py (Serve deployment options) and the operator
(serveConfigV2 and KubeRay worker groups), so both place replicas by the same rule.
A replica with world size N = tensor_parallel_size x pipeline_parallel_size > 1 gets, as
Ray Serve LLM does, a placement group of N GPU bundles; the replica actor itself takes no
GPU and sits in the first bundle beside the first vLLM worker (vLLM's Ray executor starts
one worker per GPU bundle of the replica's placement group).
"""

from __future__ import annotations

import math
from typing import Any

from agentserve.spec import ModelSpec

__all__ = ["gpus_per_node", "replica_placement", "world_size"]


def world_size(model: ModelSpec) -> int:
    """vLLM workers (GPUs) one replica of `model` runs: TP x PP."""
    return model.tensor_parallel_size * model.pipeline_parallel_size


def gpus_per_node(model: ModelSpec) -> int:
    """GPUs each worker pod (node) of a replica holds."""
    return model.replicas.num_gpus // model.replicas.nodes_per_replica


def _share(gpus: int) -> float:
    """Each bundle's share of a pod's one unit of the group resource, rounded down to Ray's
    4 decimals so that `gpus` bundles always fit one pod (1/6 -> 0.1666, never 0.1667)."""
    return math.floor(10_000 / gpus) / 10_000


def replica_placement(model: ModelSpec, group_resource: str | None = None) -> dict[str, Any]:
    """Serve deployment options that place one replica of `model`.

    `group_resource` is the custom Ray resource of the model's KubeRay worker group (one
    unit per pod), pinning the replica to its own pods; None outside Kubernetes. Returns
    {"ray_actor_options": ...} and, when world_size > 1, "placement_group_bundles" and
    "placement_group_strategy" (STRICT_PACK on one node, PACK across nodes).
    """
    replicas = model.replicas
    world = world_size(model)
    if world == 1:
        options: dict[str, Any] = {"num_cpus": replicas.num_cpus, "num_gpus": replicas.num_gpus}
        if group_resource:
            options["resources"] = {group_resource: 1}
        return {"ray_actor_options": options}
    gpu_bundle: dict[str, float] = {"GPU": 1}
    if group_resource:
        gpu_bundle[group_resource] = _share(gpus_per_node(model))
    # distinct dicts: a shared one would be written as a YAML alias into serveConfigV2
    bundles = [{"CPU": replicas.num_cpus, **gpu_bundle}]
    bundles += [dict(gpu_bundle) for _ in range(world - 1)]
    return {
        "ray_actor_options": {"num_cpus": replicas.num_cpus, "num_gpus": 0},
        "placement_group_bundles": bundles,
        "placement_group_strategy": "STRICT_PACK" if replicas.nodes_per_replica == 1 else "PACK",
    }

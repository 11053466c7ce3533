"""The PodDisruptionBudget of one AgentServe's model replica pods: a node drain (kubectl
drain, a cluster upgrade, the cluster autoscaler) evicts at most
kubernetes.worker_max_unavailable of them at once, so a drain of several GPU nodes never
takes every replica down together. Ray's own autoscaler is not held back: KubeRay deletes
the pods it scales down, it does not evict them.

Only models whose replica is one pod are covered: in a replica spread over several pods,
every pod but the replica's own is never Ready (pods.worker_group), and a budget counts an
unready pod as already disrupted, so it would refuse every eviction and block the drain.
The head is not covered either: one pod, and a budget on it would block every drain of its
node.
"""

from __future__ import annotations

from typing import Any

from agentserve_operator import resource as r
from agentserve_operator.pods import (
    LABEL_COMPONENT,
    LABEL_DEPLOYMENT,
    LABEL_MODEL,
    worker_group_name,
)

__all__ = ["covered_groups", "pod_disruption_budget"]


def covered_groups(d: r.Desired) -> list[str]:
    """Worker groups (pods.worker_group_name) whose replicas are one pod each."""
    return [worker_group_name(m.name) for m in d.spec.models if m.replicas.nodes_per_replica == 1]


def pod_disruption_budget(d: r.Desired, metadata: dict[str, Any]) -> dict[str, Any] | None:
    """policy/v1 PodDisruptionBudget over the covered worker pods (KubeRay labels them
    ray.io/node-type=worker), with `metadata` (name, labels, owner); None when
    worker_max_unavailable is null or no model is covered. An unhealthy pod (a replica that
    never became Ready) may always be evicted: it serves nothing to protect."""
    groups = covered_groups(d)
    if d.kube.worker_max_unavailable is None or not groups:
        return None
    selector = {
        "matchLabels": {LABEL_DEPLOYMENT: d.name, LABEL_COMPONENT: "ray",
                        "ray.io/node-type": "worker"},
        "matchExpressions": [{"key": LABEL_MODEL, "operator": "In", "values": groups}],
    }  # fmt: skip
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata,
        "spec": {
            "maxUnavailable": d.kube.worker_max_unavailable,
            "selector": selector,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }

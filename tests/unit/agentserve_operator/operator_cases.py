"""AgentServe CR bodies shared by the operator tests."""

from __future__ import annotations

import copy
from typing import Any

GPU_CR: dict[str, Any] = {
    "apiVersion": "agentserve.dev/v1alpha1",
    "kind": "AgentServe",
    "metadata": {"name": "demo", "namespace": "default"},
    "spec": {
        "models": [
            {
                "name": "qwen3-8b",
                "source": "/models/qwen3-8b",
                "drafter": {"enabled": True, "path": "/models/qwen3-8b-dflash"},
                "replicas": {
                    "num_gpus": 1,
                    "min_replicas": 1,
                    "max_replicas": 4,
                    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                },
            }
        ],
        "tenants": [{"name": "alice", "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50}}],
        "kubernetes": {"api_key_secret": "demo-keys", "model_volume": {"claim_name": "models"}},
    },
}
ALLOWED = {"agentserve.dev/allow-reference": "true"}  # references.ALLOW_LABEL
SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "demo-keys", "namespace": "default", "labels": dict(ALLOWED)},
    "stringData": {"alice": "sk-alice-secret"},
}
MODELS_PVC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "models", "namespace": "default", "labels": dict(ALLOWED)},
}


def allow_references(cluster: Any, cr: dict[str, Any]) -> None:
    """Do what the owner of each Secret and claim the CR references does (`kubectl label
    ... agentserve.dev/allow-reference=true`); claims absent from `cluster` are created."""
    from agentserve_operator.references import references
    from agentserve_operator.resource import kube_spec_of

    namespace = cr["metadata"].get("namespace", "default")
    for _, kind, name in references(kube_spec_of(cr)):
        obj = cluster.find(kind, name, namespace)
        if obj is None:
            meta = {"name": name, "namespace": namespace}
            obj = cluster.put({"apiVersion": "v1", "kind": kind, "metadata": meta})
        obj["metadata"].setdefault("labels", {}).update(ALLOWED)


def gpu_cr(**spec_changes: Any) -> dict[str, Any]:
    """A copy of GPU_CR with top-level spec keys replaced."""
    cr = copy.deepcopy(GPU_CR)
    cr["spec"].update(copy.deepcopy(spec_changes))
    return cr

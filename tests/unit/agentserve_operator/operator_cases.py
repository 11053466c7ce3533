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
SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "demo-keys", "namespace": "default"},
    "stringData": {"alice": "sk-alice-secret"},
}


def gpu_cr(**spec_changes: Any) -> dict[str, Any]:
    """A copy of GPU_CR with top-level spec keys replaced."""
    cr = copy.deepcopy(GPU_CR)
    cr["spec"].update(copy.deepcopy(spec_changes))
    return cr

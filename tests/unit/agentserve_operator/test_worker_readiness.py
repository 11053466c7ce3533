"""Worker pods and KubeRay's readiness probe (review of issue 28, item 1).

KubeRay 1.4.2-1.6.2 gives every RayService worker a readiness probe that, besides the raylet,
checks `localhost:<the container port named "serve", else 8000>/-/healthz`: the Serve proxy.
Ray Serve runs a proxy only on the head and on nodes holding a replica, and KubeRay's serve
Service selects every Ready worker (its selector cannot be changed): a worker is Ready exactly
when it takes traffic. So the worker names its `serve` port (server.port), no probe is
overridden, and in a replica spread over several pods only the pod holding the replica is
Ready; status counts that replica once all its pods run.
"""

from __future__ import annotations

from typing import Any

import pytest
from agentserve_operator import manifests as m
from agentserve_operator.resource import desired_from_cr
from operator_cases import gpu_cr

KEYS = {"alice": "sk-alice-secret"}
KUBERAY_DEFAULT_SERVING_PORT = 8000  # utils.DefaultServingPort (v1.4.2 .. v1.6.2)


def kuberay_serve_probe_port(container: dict[str, Any]) -> int:
    """utils.FindContainerPort(container, "serve", DefaultServingPort), as KubeRay does."""
    for port in container.get("ports") or []:
        if port.get("name") == "serve":
            return port["containerPort"]
    return KUBERAY_DEFAULT_SERVING_PORT


def _groups(nodes: int, port: int) -> list[dict[str, Any]]:
    model = {
        "name": "big",
        "source": "/models/big",
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": nodes,
        "drafter": {"enabled": False},
        "replicas": {"num_gpus": 8 * nodes, "nodes_per_replica": nodes},
    }
    cr = gpu_cr(models=[model], server={"port": port})
    rs = m.rayservice(desired_from_cr(cr, KEYS))
    return rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("port", [8000, 9000])
def test_kuberay_probes_the_port_the_workers_proxy_listens_on(nodes, port):
    [group] = _groups(nodes, port)
    [container] = group["template"]["spec"]["containers"]
    assert kuberay_serve_probe_port(container) == port
    # KubeRay injects its probes only where the template sets none: keep its readiness
    # probe (a proxy-less Ready worker would be an endpoint that refuses connections)
    assert "readinessProbe" not in container and "livenessProbe" not in container

"""Pure status: (desired, observed RayService and pods, actions taken, error) -> CR status.

Conditions follow Kubernetes conventions: Ready, Progressing, Degraded, each with a reason;
lastTransitionTime changes only when a condition's status flips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentserve.serve.names import deployment_name

from agentserve_operator import manifests as m
from agentserve_operator import resource as r

__all__ = [
    "Observation",
    "active_cluster",
    "compute_status",
    "invalid_status",
    "ready_replicas",
    "running_replicas",
    "serving_replicas",
]


@dataclass(frozen=True)
class Observation:
    """What status is computed from: the RayService (None = absent), the Ray pods, Serve's
    own status from the active cluster's ingress (serve_probe: {"applications": {app:
    {"deployments": {name: {"replicas": {state: count}}}}}}; None = not reachable) and the
    readyReplicas per model the last status showed."""

    rayservice: dict[str, Any] | None
    pods: list[dict[str, Any]]
    serve: dict[str, Any] | None = None
    previous_ready: dict[str, int] = field(default_factory=dict)


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int,
               previous: list[dict[str, Any]], now: str) -> dict[str, Any]:  # fmt: skip
    status = "True" if ok else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    changed = old is None or old.get("status") != status
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
    }


def _pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _pod_running(pod: dict[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") == "Running"


def active_cluster(rs: dict[str, Any] | None) -> str | None:
    """The Ray cluster serving the RayService's traffic (KubeRay's
    status.activeServiceStatus.rayClusterName); None before KubeRay makes one active.
    A NewCluster upgrade's pending cluster is in pendingServiceStatus and serves nothing."""
    active = ((rs or {}).get("status") or {}).get("activeServiceStatus") or {}
    return active.get("rayClusterName") or None


def rayservice_ready(rs: dict[str, Any] | None) -> bool:
    """KubeRay >= 1.3 sets condition Ready; older versions serviceStatus Running."""
    if rs is None:
        return False
    status = rs.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return status.get("serviceStatus") == "Running"


def _app_status(rs: dict[str, Any] | None, app: str) -> dict[str, Any]:
    active = ((rs or {}).get("status") or {}).get("activeServiceStatus") or {}
    return (active.get("applicationStatuses") or {}).get(app) or {}


def ready_replicas(ready_pods: int, running_pods: int, nodes_per_replica: int) -> int:
    """Serving replicas of a worker group. A pod is Ready only with a Serve proxy, which
    Ray Serve runs only on nodes holding a replica (KubeRay's worker readiness probe checks
    it): a replica over `nodes_per_replica` pods has one Ready pod, its own, and serves only
    while all its pods run. So: Ready pods, bounded by the whole replicas running pods make."""
    return min(ready_pods, running_pods // max(1, nodes_per_replica))


def running_replicas(serve: dict[str, Any] | None, app: str, deployment: str) -> int | None:
    """RUNNING replicas of a deployment in Serve's own status; None when it does not say."""
    apps = (serve or {}).get("applications") or {}
    dep = (((apps.get(app) or {}).get("deployments") or {}).get(deployment)) or None
    if dep is None or not isinstance(dep.get("replicas"), dict):
        return None
    return int(dep["replicas"].get("RUNNING", 0))


def serving_replicas(running: int | None, pod_ready: int, deployment_status: str,
                     previous: int) -> int:  # fmt: skip
    """Replicas that serve: Serve's RUNNING count (bounded by whole replicas' pods: a
    replica's pods all run), else, without Serve's count, the pod count only when KubeRay
    reports the deployment HEALTHY (every replica it wants RUNNING); while it is not, a
    Ready pod may hold a replica still loading, so no more than the last status showed."""
    if running is not None:
        return min(running, pod_ready)
    if deployment_status == "HEALTHY":
        return pod_ready
    return min(pod_ready, previous)


def model_statuses(d: r.Desired, obs: Observation) -> list[dict[str, Any]]:
    """Per model: ready replicas (serving_replicas: Serve's RUNNING replicas, bounded by
    ready_replicas over the active Ray cluster's pods of its worker group), bounds, Serve
    deployment status."""
    app = _app_status(obs.rayservice, d.spec.name)
    deployments = app.get("serveDeploymentStatuses") or {}
    cluster = active_cluster(obs.rayservice)
    out = []
    for model in d.spec.models:
        group = m.worker_group_name(model.name)
        pods = [
            p
            for p in obs.pods
            if (labels := p.get("metadata", {}).get("labels", {})).get(m.LABEL_MODEL) == group
            and cluster is not None
            and labels.get("ray.io/cluster") == cluster
        ]
        by_pods = ready_replicas(
            sum(map(_pod_ready, pods)), sum(map(_pod_running, pods)),
            model.replicas.nodes_per_replica,
        )  # fmt: skip
        serve = deployments.get(deployment_name(model.name)) or {}
        running = running_replicas(obs.serve, d.spec.name, deployment_name(model.name))
        ready = serving_replicas(running, by_pods, serve.get("status", ""),
                                 obs.previous_ready.get(model.name, 0))  # fmt: skip
        out.append({
            "name": model.name,
            "readyReplicas": ready,
            "minReplicas": model.replicas.min_replicas,
            "maxReplicas": model.replicas.max_replicas,
            "deploymentStatus": serve.get("status", "Unknown"),
        })  # fmt: skip
    return out


def compute_status(d: r.Desired, obs: Observation, applied: int,
                   previous: list[dict[str, Any]], now: str) -> dict[str, Any]:  # fmt: skip
    """Status after a reconcile that applied `applied` actions."""
    models = model_statuses(d, obs)
    ready = rayservice_ready(obs.rayservice) and applied == 0
    app_state = _app_status(obs.rayservice, d.spec.name).get("status", "")
    failed = app_state in ("DEPLOY_FAILED", "UNHEALTHY")
    g = d.generation
    if ready:
        ready_c = ("Serving", "The OpenAI endpoint is serving.")
    elif failed:
        ready_c = ("ServeApplicationFailed", f"Serve application is {app_state}.")
    else:
        ready_c = ("RayServiceNotReady", "Waiting for KubeRay to bring up the RayService.")
    progressing = (
        ("Applied", f"Applied {applied} change(s).")
        if applied
        else (("Stable", "Nothing to change.") if ready else ("WaitingForRayService", ready_c[1]))
    )
    degraded = (
        ("ServeApplicationFailed", ready_c[1]) if failed else ("AsExpected", "No problems seen.")
    )
    conditions = [
        _condition("Ready", ready, *ready_c, g, previous, now),
        _condition("Progressing", not ready, *progressing, g, previous, now),
        _condition("Degraded", failed, *degraded, g, previous, now),
    ]  # fmt: skip
    port = d.spec.server.port
    total_ready = sum(x["readyReplicas"] for x in models)
    low = sum(x["minReplicas"] for x in models)
    high = sum(x["maxReplicas"] for x in models)
    return {
        "observedGeneration": g,
        "conditions": conditions,
        "endpoint": f"http://{m.names(d.name)['Service']}.{d.namespace}.svc:{port}/v1",
        "modelNames": ",".join(x["name"] for x in models),
        "readyReplicas": f"{total_ready}/{low}-{high}" if low != high else f"{total_ready}/{low}",
        "models": models,
    }


def invalid_status(generation: int, message: str, previous: list[dict[str, Any]],
                   now: str) -> dict[str, Any]:  # fmt: skip
    """Status of a CR whose spec cannot be deployed; running children are left as they are."""
    conditions = [
        _condition("Ready", False, "InvalidSpec", message, generation, previous, now),
        _condition("Progressing", False, "InvalidSpec", "Fix the spec.", generation,
                   previous, now),
        _condition("Degraded", True, "InvalidSpec", message, generation, previous, now),
    ]  # fmt: skip
    return {"observedGeneration": generation, "conditions": conditions}

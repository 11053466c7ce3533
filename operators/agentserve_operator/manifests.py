"""Pure builders: Desired -> the child objects of one AgentServe (RayService, ConfigMap,
NetworkPolicy for the Ray pods, admin Service, ServiceMonitor, PodMonitor). Same input, same
dicts; every object carries the owner reference. The Ray pods themselves: pods.py.

The OpenAI endpoint `<name>-openai` is the RayService's serveService: KubeRay keeps its
selector on the *active* Ray cluster's pods whose Serve proxy is ready, so during an
upgrade (a pending cluster beside the active one) traffic stays on the cluster that serves
and moves in one step.

/metrics and /status are not on the API Service: the ingress replicas are pinned to the
head pod (custom resource HEAD_RESOURCE); replica k serves them on server.metrics_port + k
there (`admin_ports`); the admin Service (ClusterIP, head pod only) exposes those ports and
the ServiceMonitor scrapes each (every ingress replica counts its own requests). The
PodMonitor scrapes Ray's metrics export port on every Ray pod: Ray's metrics, and vLLM's
(vllm:*, exported as ray_vllm_*) where the engine reports them through Ray's metrics agent
(vLLM's RayPrometheusStatLogger); vLLM's default Prometheus logger keeps them in the
replica process, where nothing serves them.
"""

from __future__ import annotations

from typing import Any

import yaml
from agentserve.admission.shares import ingress_replicas
from agentserve.placement import replica_placement
from agentserve.serve.names import INGRESS_NAME, QUOTA_NAME, deployment_name
from agentserve.spec import to_yaml
from agentserve.tenant_config import app_args, ingress_user_config

from agentserve_operator import kuberay as kr
from agentserve_operator import resource as r
from agentserve_operator.disruption import pod_disruption_budget
from agentserve_operator.pods import (
    DASHBOARD_AGENT_PORT,
    DASHBOARD_PORT,
    HEAD_RESOURCE,
    LABEL_COMPONENT,
    LABEL_DEPLOYMENT,
    LABEL_MODEL,
    RAY_METRICS_PORT,
    SPEC_MOUNT,
    autoscaler_volume_mounts,
    container_security_context,
    head_group,
    labels,
    worker_group,
    worker_group_name,
)
from agentserve_operator.upgrade import upgrade_strategy

__all__ = ["children", "names", "worker_group_name"]
__all__ += ["HEAD_RESOURCE", "LABEL_COMPONENT", "LABEL_DEPLOYMENT", "LABEL_MODEL", "SPEC_MOUNT"]

# `<module>:<builder>` that Ray Serve imports in the pods; the builder takes the `args`
# mapping ({"spec": <DeploymentSpec as JSON>}) and returns build_app(spec).
APP_IMPORT_PATH = "agentserve.serve.app:build_app_from_args"
GPU = "nvidia.com/gpu"  # ReplicaSpec.gpu_resource_name's default
API_VERSIONS = {
    "ConfigMap": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "RayService": "ray.io/v1",
    "Service": "v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PodDisruptionBudget": "policy/v1",
}


# child role -> Kubernetes kind (two roles are Services). "Service" (<name>-openai) is
# KubeRay's now (RayService serveService); it stays a role so that one this operator made
# before is deleted as stale (plan deletes only what the AgentServe owns).
KINDS = {
    "ConfigMap": "ConfigMap",
    "RayService": "RayService",
    "Service": "Service",
    "AdminService": "Service",
    "ServiceMonitor": "ServiceMonitor",
    "PodMonitor": "PodMonitor",
    "NetworkPolicy": "NetworkPolicy",
    "PodDisruptionBudget": "PodDisruptionBudget",
}


def names(name: str) -> dict[str, str]:
    """Child object names of the AgentServe `name` (by role, see KINDS)."""
    return {
        "ConfigMap": f"{name}-spec",
        "RayService": name,
        "Service": f"{name}-openai",
        "AdminService": f"{name}-admin",
        "ServiceMonitor": name,
        "PodMonitor": f"{name}-ray",
        "NetworkPolicy": f"{name}-ray",
        "PodDisruptionBudget": f"{name}-workers",
    }


def _meta(d: r.Desired, role: str, component: str) -> dict[str, Any]:
    owner = {
        "apiVersion": r.API_VERSION,
        "kind": r.KIND,
        "name": d.name,
        "uid": d.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "name": names(d.name)[role],
        "namespace": d.namespace,
        "labels": labels(d, component),
        "ownerReferences": [owner],
    }


def configmap(d: r.Desired) -> dict[str, Any]:
    """The validated spec (tenant keys appear only as SHA-256), for people and tools."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(d, "ConfigMap", "spec"),
        "data": {"spec.yaml": to_yaml(d.spec)},
    }


def _on_head() -> dict[str, Any]:
    """ray_actor_options of a deployment pinned to the head pod (a new dict each time: a
    shared one would be written as a YAML alias)."""
    return {"num_cpus": 0, "resources": {HEAD_RESOURCE: 1}}


def serve_config(d: r.Desired) -> dict[str, Any]:
    """Ray Serve config (serveConfigV2): one application, model replicas pinned to groups.
    Tenants are the ingress's user_config, not application args (agentserve.tenant_config),
    so changing a key or a limit is a lightweight update of the ingress alone."""
    deployments = [
        {
            "name": deployment_name(m.name),
            **replica_placement(m, group_resource=worker_group_name(m.name)),
        }
        for m in d.spec.models
    ]
    if ingress_replicas(d.spec) > 1:  # the ingress replicas' shared tenant limits
        deployments.append({"name": QUOTA_NAME, "ray_actor_options": _on_head()})
    deployments.append(
        {
            "name": INGRESS_NAME,
            "ray_actor_options": _on_head(),
            # tenants apart from args: a key rotation updates only the ingress in place
            "user_config": ingress_user_config(d.spec),
        }
    )
    app = {
        "name": d.spec.name,
        "route_prefix": "/",
        "import_path": APP_IMPORT_PATH,
        "args": app_args(d.spec),
        "deployments": deployments,
    }
    return {
        "proxy_location": "EveryNode",
        "http_options": {
            "host": r.IN_POD_HOST,
            "port": d.spec.server.port,
            "request_timeout_s": d.spec.server.request_timeout_s,
        },
        "applications": [app],
    }


def rayservice(d: r.Desired, kuberay: kr.KubeRay | None = None) -> dict[str, Any]:
    """The KubeRay RayService running the agentserve Serve application, with only the
    fields the RayService CRD of `kuberay` (default: the newest supported) defines."""
    kuberay = kuberay or kr.KubeRay(kr.DEFAULT)  # type: ignore[arg-type]
    cluster: dict[str, Any] = {"rayVersion": d.kube.ray_version}
    if kuberay.auth_options:
        # KubeRay >= 1.5 makes a Secret with a random token and sets RAY_AUTH_MODE=token
        # and RAY_AUTH_TOKEN on every Ray container: GCS, dashboard and the Jobs API refuse
        # callers without it (KubeRay's own client has it). 1.4 has no such field: there
        # the NetworkPolicy alone guards the dashboard.
        cluster["authOptions"] = {"mode": "token"}
    if d.kube.gcs_fault_tolerance is not None:
        cluster["gcsFaultToleranceOptions"] = gcs_fault_tolerance(d.kube.gcs_fault_tolerance)
    cluster.update(
        {
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {
                "upscalingMode": "Default",
                "idleTimeoutSeconds": 60,
                # the autoscaler sidecar (in the head pod) patches the RayCluster and lists
                # pods: the only container with a service-account token
                "volumeMounts": autoscaler_volume_mounts(),
                "securityContext": container_security_context(),
            },
            "headGroupSpec": head_group(d, admin_ports(d)),
            "workerGroupSpecs": [worker_group(d, m) for m in d.spec.models],
        }
    )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": _meta(d, "RayService", "ray"),
        "spec": {
            # explicit, never KubeRay's default (NewCluster: twice the GPUs while a change
            # under rayClusterConfig rolls out; KubeRay also reads the operator's
            # ENABLE_ZERO_DOWNTIME when unset): upgrade.py. Worker replica bounds and
            # serveConfigV2 are updated in place whatever the strategy.
            "upgradeStrategy": upgrade_strategy(d.kube, kuberay),
            "serveService": serve_service(d),
            "serveConfigV2": yaml.safe_dump(serve_config(d), sort_keys=False),
            "rayClusterConfig": cluster,
        },
    }


def gcs_fault_tolerance(ft: r.GcsFaultToleranceSpec) -> dict[str, Any]:
    """rayClusterConfig.gcsFaultToleranceOptions (KubeRay >= 1.3): GCS state in an external
    Redis, the password from a Secret (never in the RayService)."""
    out: dict[str, Any] = {"redisAddress": ft.redis_address}
    if ft.redis_password_secret:
        ref = {"name": ft.redis_password_secret, "key": ft.redis_password_key}
        out["redisPassword"] = {"valueFrom": {"secretKeyRef": ref}}
    if ft.external_storage_namespace:
        out["externalStorageNamespace"] = ft.external_storage_namespace
    return out


def serve_service(d: r.Desired) -> dict[str, Any]:
    """The OpenAI endpoint `<name>-openai`, as RayService serveService: KubeRay creates it
    and points its selector at the active cluster's pods labelled ray.io/serve=true (their
    Serve proxy is healthy), never at a pending cluster's; its port is the head's `serve`."""
    port = d.spec.server.port
    return {
        "metadata": {"name": names(d.name)["Service"], "labels": labels(d, "openai")},
        "spec": {
            "type": d.kube.service_type,
            "ports": [{"name": "serve", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def admin_ports(d: r.Desired) -> list[tuple[str, int]]:
    """(port name, port) of each ingress replica's admin endpoints on the head pod."""
    base = d.spec.server.metrics_port
    return [
        ("admin" if k == 0 else f"admin-{k}", base + k) for k in range(ingress_replicas(d.spec))
    ]


def admin_service(d: r.Desired) -> dict[str, Any]:
    """The ingress replicas' /metrics and /status: the head pod's admin ports, inside the
    cluster."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(d, "AdminService", "admin"),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_DEPLOYMENT: d.name, "ray.io/node-type": "head"},
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in admin_ports(d)
            ],
        },
    }


def servicemonitor(d: r.Desired) -> dict[str, Any]:
    """Prometheus Operator scrape of the ingress's /metrics through the admin Service."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(d, "ServiceMonitor", "monitoring"),
        "spec": {
            "selector": {"matchLabels": {LABEL_DEPLOYMENT: d.name, LABEL_COMPONENT: "admin"}},
            "endpoints": [
                {"port": name, "path": "/metrics", "interval": "15s"} for name, _ in admin_ports(d)
            ],
        },
    }


def podmonitor(d: r.Desired) -> dict[str, Any]:
    """Prometheus Operator scrape of Ray's metrics export port (`metrics`, RAY_METRICS_PORT,
    pinned in every group's rayStartParams) on every Ray pod, head and workers: Ray's own
    metrics and whatever the replicas report through Ray's metrics agent (vLLM's metrics
    with its RayPrometheusStatLogger, as ray_vllm_*)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(d, "PodMonitor", "monitoring"),
        "spec": {
            "selector": {"matchLabels": {LABEL_DEPLOYMENT: d.name, LABEL_COMPONENT: "ray"}},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


# KubeRay's operator pods (kubernetes.kuberay_operator_labels) reach the head's dashboard
# (Serve config submission, status) and the dashboard agent on each pod.
DASHBOARD_PORTS = (DASHBOARD_PORT, DASHBOARD_AGENT_PORT)


def network_policy(d: r.Desired) -> dict[str, Any]:
    """Who may reach the Ray pods: anyone the API port (keys guard it); pods of
    kubernetes.monitoring_namespaces (empty: of every namespace) the admin and Ray metrics
    ports (Prometheus; /status, tenant names in the metrics); KubeRay's operator (in
    kubernetes.kuberay_namespace) the dashboard ports; the deployment's own Ray pods every
    port (GCS, raylets, object transfer).
    Everything else (GCS 6379, Ray client 10001, the dashboard from elsewhere) is refused.
    The dashboard binds 0.0.0.0 (pods.head_group): this policy is what keeps it private."""
    ray_pods = {"matchLabels": {LABEL_DEPLOYMENT: d.name, LABEL_COMPONENT: "ray"}}
    # one peer, both selectors: KubeRay's operator pods in KubeRay's namespace only (a pod
    # anyone labels so elsewhere must not reach an unauthenticated dashboard)
    kuberay_ns = {"kubernetes.io/metadata.name": d.kube.kuberay_namespace}
    kuberay = {
        "namespaceSelector": {"matchLabels": kuberay_ns},
        "podSelector": {"matchLabels": dict(d.kube.kuberay_operator_labels)},
    }
    admin = [port for _, port in admin_ports(d)] + [RAY_METRICS_PORT]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(d, "NetworkPolicy", "ray"),
        "spec": {
            "podSelector": ray_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [_tcp(d.spec.server.port)]},
                {"from": _scrapers(d), "ports": [_tcp(p) for p in admin]},
                {"from": [kuberay], "ports": [_tcp(p) for p in DASHBOARD_PORTS]},
                {"from": [{"podSelector": ray_pods}]},
            ],
        },
    }


def _scrapers(d: r.Desired) -> list[dict[str, Any]]:
    """Peers of the admin ports: pods of the monitoring namespaces, or of every one."""
    names = list(d.kube.monitoring_namespaces)
    if not names:
        return [{"namespaceSelector": {}}]
    match = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": names}
    return [{"namespaceSelector": {"matchExpressions": [match]}}]


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def children(d: r.Desired, *, monitoring_available: bool,
             kuberay: kr.KubeRay | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Every child object one AgentServe should have, in apply order; the RayService as
    the CRD of `kuberay` (default: the newest supported) accepts it."""
    objs = [configmap(d), network_policy(d), rayservice(d, kuberay), admin_service(d)]
    pdb = pod_disruption_budget(d, _meta(d, "PodDisruptionBudget", "workers"))
    if pdb is not None:
        objs.append(pdb)
    if d.kube.monitoring and monitoring_available:
        objs += [servicemonitor(d), podmonitor(d)]
    return objs

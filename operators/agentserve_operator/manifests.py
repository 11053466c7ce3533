"""Pure builders: Desired -> the child objects of one AgentServe (RayService, ConfigMap,
NetworkPolicy for the Ray pods, Service for the API, admin Service, ServiceMonitor). Same
input, same dicts; every object carries the owner reference.

/metrics and /status are not on the API Service: the ingress replicas are pinned to the
head pod (custom resource HEAD_RESOURCE); replica k serves them on server.metrics_port + k
there (`admin_ports`); the admin Service (ClusterIP, head pod only) exposes those ports and
the ServiceMonitor scrapes each (every ingress replica counts its own requests).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import yaml
from agentserve.placement import gpus_per_node, replica_placement
from agentserve.serve.admission import ingress_replicas
from agentserve.serve.names import INGRESS_NAME, QUOTA_NAME, deployment_name
from agentserve.spec import ModelSpec, TolerationSpec, to_yaml
from agentserve.tenant_config import app_args, ingress_user_config

from agentserve_operator import resource as r

__all__ = ["children", "names", "worker_group_name"]

# `<module>:<builder>` that Ray Serve imports in the pods; the builder takes the `args`
# mapping ({"spec": <DeploymentSpec as JSON>}) and returns build_app(spec).
APP_IMPORT_PATH = "agentserve.serve.app:build_app_from_args"
SPEC_MOUNT = "/etc/agentserve"
LABEL_DEPLOYMENT = "agentserve.dev/deployment"
LABEL_COMPONENT = "agentserve.dev/component"
LABEL_MODEL = "agentserve.dev/model-group"
GPU = "nvidia.com/gpu"
POD_IP_ENV = {"name": "AGENTSERVE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
HEAD_RESOURCE = "agentserve-head"  # only the head pod has it; the ingress asks for it
API_VERSIONS = {
    "ConfigMap": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "RayService": "ray.io/v1",
    "Service": "v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
}


# child role -> Kubernetes kind (two roles are Services)
KINDS = {
    "ConfigMap": "ConfigMap",
    "RayService": "RayService",
    "Service": "Service",
    "AdminService": "Service",
    "ServiceMonitor": "ServiceMonitor",
    "NetworkPolicy": "NetworkPolicy",
}


def names(name: str) -> dict[str, str]:
    """Child object names of the AgentServe `name` (by role, see KINDS)."""
    return {
        "ConfigMap": f"{name}-spec",
        "RayService": name,
        "Service": f"{name}-openai",
        "AdminService": f"{name}-admin",
        "ServiceMonitor": name,
        "NetworkPolicy": f"{name}-ray",
    }


def labels(d: r.Desired, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "agentserve",
        "app.kubernetes.io/instance": d.name,
        "app.kubernetes.io/managed-by": r.FIELD_MANAGER,
        LABEL_DEPLOYMENT: d.name,
        LABEL_COMPONENT: component,
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


def worker_group_name(model: str) -> str:
    """KubeRay worker group (and Ray custom resource) of a model: DNS-safe, unique, short."""
    slug = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")[:24].strip("-") or "model"
    return f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:6]}"


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


def _volumes(d: r.Desired) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": names(d.name)["ConfigMap"]}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if d.kube.model_volume is not None:
        mv = d.kube.model_volume
        claim = {"claimName": mv.claim_name, "readOnly": mv.read_only}
        volumes.append({"name": "models", "persistentVolumeClaim": claim})
        mounts.append({"name": "models", "mountPath": mv.mount_path, "readOnly": mv.read_only})
    if d.kube.hub_cache is not None:
        hc = d.kube.hub_cache
        volumes.append({"name": "hf-cache", "persistentVolumeClaim": {"claimName": hc.claim_name}})
        mounts.append({"name": "hf-cache", "mountPath": hc.mount_path})
    return volumes, mounts


def _env(d: r.Desired) -> list[dict[str, Any]]:
    """Pod environment: the spec path and the Hugging Face hub settings (offline unless a
    source is a Hugging Face id to download; HF_HOME on the cache volume; HF_TOKEN)."""
    env: list[dict[str, Any]] = [{"name": "AGENTSERVE_SPEC", "value": f"{SPEC_MOUNT}/spec.yaml"}]
    if d.kube.hub_offline or not r.hub_ids(d.spec):
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    if d.kube.hub_cache is not None:
        env.append({"name": "HF_HOME", "value": d.kube.hub_cache.mount_path})
    if d.kube.hf_token_secret:
        ref = {"name": d.kube.hf_token_secret, "key": d.kube.hf_token_key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def _container(d: r.Desired, name: str, resources: dict[str, Any]) -> dict[str, Any]:
    _, mounts = _volumes(d)
    return {
        "name": name,
        "image": d.kube.image,
        "imagePullPolicy": d.kube.image_pull_policy,
        "env": _env(d),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }


def _pod_template(d: r.Desired, container: dict[str, Any], extra_labels: dict[str, str],
                  **spec: Any) -> dict[str, Any]:  # fmt: skip
    volumes, _ = _volumes(d)
    return {
        "metadata": {"labels": {**labels(d, "ray"), **extra_labels}},
        "spec": {
            "containers": [container],
            "volumes": volumes,
            # Ray needs no Kubernetes API access; syscalls filtered by the runtime's profile
            # (the root filesystem stays writable: Ray writes /tmp/ray and its sessions)
            "automountServiceAccountToken": False,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            **spec,
        },
    }


def head_group(d: r.Desired) -> dict[str, Any]:
    """Ray head: GCS, dashboard, Serve controller, proxy and ingress (with its admin port);
    never GPUs."""
    size = {"cpu": str(d.kube.head_cpus), "memory": d.kube.head_memory}
    container = _container(d, "ray-head", {"requests": size, "limits": dict(size)})
    container["env"].append(POD_IP_ENV)
    container["ports"] = [
        {"name": "gcs", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
        {"name": "serve", "containerPort": d.spec.server.port},
        {"name": "metrics", "containerPort": 8080},
        *({"name": name, "containerPort": port} for name, port in admin_ports(d)),
    ]
    return {
        # The dashboard listens on the pod IP, never 0.0.0.0 (KubeRay runs `ray start` in
        # bash, which expands the variable): KubeRay submits the Serve config through it.
        # Token auth (authOptions, rayservice()) and the NetworkPolicy guard it.
        "rayStartParams": {
            "dashboard-host": "$" + POD_IP_ENV["name"],
            "num-gpus": "0",
            "resources": "'" + json.dumps({HEAD_RESOURCE: 100}) + "'",
        },
        "template": _pod_template(d, container, {}),
    }


def toleration(t: TolerationSpec) -> dict[str, Any]:
    """Spec toleration -> Kubernetes toleration (nulls left out)."""
    raw = {
        "key": t.key,
        "operator": t.operator,
        "value": t.value,
        "effect": t.effect,
        "tolerationSeconds": t.toleration_seconds,
    }
    return {k: v for k, v in raw.items() if v is not None}


def worker_group(d: r.Desired, model: ModelSpec) -> dict[str, Any]:
    """One KubeRay worker group per model: one Serve replica per nodes_per_replica pods,
    each pod with num_gpus / nodes_per_replica GPUs (all of a TP x PP replica's GPUs).

    `replicas` is left out: Ray's autoscaler scales the RayCluster that KubeRay makes from
    this template, between minReplicas and maxReplicas (pods: replicas x nodes).
    """
    group = worker_group_name(model.name)
    nodes = model.replicas.nodes_per_replica
    gpus = gpus_per_node(model)
    cpus = max(1, math.ceil(model.replicas.num_cpus))
    size: dict[str, str] = {"cpu": str(cpus), "memory": d.kube.worker_memory}
    if gpus:
        size[GPU] = str(gpus)
    container = _container(d, "ray-worker", {"requests": size, "limits": dict(size)})
    spec: dict[str, Any] = {}
    if model.replicas.node_selector:
        spec["nodeSelector"] = dict(model.replicas.node_selector)
    if model.replicas.tolerations:
        spec["tolerations"] = [toleration(t) for t in model.replicas.tolerations]
    return {
        "groupName": group,
        "minReplicas": model.replicas.min_replicas * nodes,
        "maxReplicas": model.replicas.max_replicas * nodes,
        "rayStartParams": {
            "num-cpus": str(cpus),
            "num-gpus": str(gpus),
            "resources": "'" + json.dumps({group: 1}) + "'",
        },
        "template": _pod_template(d, container, {LABEL_MODEL: group}, **spec),
    }


def rayservice(d: r.Desired) -> dict[str, Any]:
    """The KubeRay RayService running the agentserve Serve application."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": _meta(d, "RayService", "ray"),
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve_config(d), sort_keys=False),
            "rayClusterConfig": {
                "rayVersion": d.kube.ray_version,
                # KubeRay >= 1.5.1 makes a Secret with a random token and sets RAY_AUTH_MODE
                # =token and RAY_AUTH_TOKEN on every Ray container: GCS, dashboard and the
                # Jobs API refuse callers without it (KubeRay's own client has it)
                "authOptions": {"mode": "token"},
                "enableInTreeAutoscaling": True,
                "autoscalerOptions": {"upscalingMode": "Default", "idleTimeoutSeconds": 60},
                "headGroupSpec": head_group(d),
                "workerGroupSpecs": [worker_group(d, m) for m in d.spec.models],
            },
        },
    }


def service(d: r.Desired) -> dict[str, Any]:
    """The OpenAI endpoint: every Ray pod whose Serve proxy KubeRay marks ready."""
    port = d.spec.server.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(d, "Service", "openai"),
        "spec": {
            "type": d.kube.service_type,
            "selector": {LABEL_DEPLOYMENT: d.name, "ray.io/serve": "true"},
            "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
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


# KubeRay's operator pods (its Helm chart's label) reach the head's dashboard (Serve config
# submission, status) and the dashboard agent on each pod.
KUBERAY_OPERATOR = {"app.kubernetes.io/name": "kuberay-operator"}
DASHBOARD_PORTS = (8265, 52365)
RAY_METRICS_PORT = 8080


def network_policy(d: r.Desired) -> dict[str, Any]:
    """Who may reach the Ray pods: anyone the API port (keys guard it); pods of the
    cluster the admin and Ray metrics ports (Prometheus); KubeRay's operator the dashboard
    ports; the deployment's own Ray pods every port (GCS, raylets, object transfer).
    Everything else (GCS 6379, Ray client 10001, the dashboard from elsewhere) is refused."""
    ray_pods = {"matchLabels": {LABEL_DEPLOYMENT: d.name, LABEL_COMPONENT: "ray"}}
    kuberay = {"namespaceSelector": {}, "podSelector": {"matchLabels": KUBERAY_OPERATOR}}
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
                {"from": [{"namespaceSelector": {}}], "ports": [_tcp(p) for p in admin]},
                {"from": [kuberay], "ports": [_tcp(p) for p in DASHBOARD_PORTS]},
                {"from": [{"podSelector": ray_pods}]},
            ],
        },
    }


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def children(d: r.Desired, *, monitoring_available: bool) -> list[dict[str, Any]]:
    """Every child object one AgentServe should have, in apply order."""
    objs = [configmap(d), network_policy(d), rayservice(d), service(d), admin_service(d)]
    if d.kube.monitoring and monitoring_available:
        objs.append(servicemonitor(d))
    return objs

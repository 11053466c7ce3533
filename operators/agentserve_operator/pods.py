"""Pure builders of the Ray pods of one AgentServe: the head group and one worker group per
model (containers, volumes, environment, scheduling, the hub prefetch init container).

Which pod gets what, and why:
- Only model replica (worker) pods mount the model volume and the hub cache and run the
  prefetch init container: the head serves the ingress, which reads no weights, and has no
  GPU node selector, so a ReadWriteOnce claim there could pin it to the wrong node.
- No pod mounts a service-account token, except the KubeRay autoscaler sidecar of the head
  (in-tree autoscaling): it alone talks to the Kubernetes API (AUTOSCALER_TOKEN_VOLUME).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from agentserve.placement import gpus_per_node
from agentserve.spec import ModelSpec, TolerationSpec

from agentserve_operator import resource as r
from agentserve_operator.key_salt import salt_env

__all__ = [
    "autoscaler_volume_mounts",
    "container_security_context",
    "head_group",
    "labels",
    "worker_group",
    "worker_group_name",
]

SPEC_MOUNT = "/etc/agentserve"
LABEL_DEPLOYMENT = "agentserve.dev/deployment"
LABEL_COMPONENT = "agentserve.dev/component"
LABEL_MODEL = "agentserve.dev/model-group"
POD_IP_ENV = {"name": "AGENTSERVE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
HEAD_RESOURCE = "agentserve-head"  # only the head pod has it; the ingress asks for it
DASHBOARD_PORT = 8265  # KubeRay's head probe: localhost:8265/api/gcs_healthz
DASHBOARD_AGENT_PORT = 52365  # KubeRay's probes: localhost:52365/api/local_raylet_healthz
RAY_METRICS_PORT = 8080  # Ray's metrics export on every pod (Ray's, and vLLM's via Ray)
POD_FS_GROUP = 100  # "users": the group of the serving images' files (docker/Dockerfile.cuda)
HUB_CACHE_MOUNT = "/hf-cache"  # per-pod cache when kubernetes.hub_cache is not set
# vLLM's compile cache (VLLM_CACHE_ROOT): a restarted engine loads what a first start compiled
# (about a minute on CPU, see docs/benchmarks.md "startup"). On the hub cache claim when there
# is one (kept across pods and shared by every replica that mounts it), else per pod.
ENGINE_CACHE_MOUNT = "/engine-cache"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
AUTOSCALER_TOKEN_VOLUME = "autoscaler-token"


def labels(d: r.Desired, component: str) -> dict[str, str]:
    """The labels of every child object (and Ray pod) of the AgentServe `d`."""
    return {
        "app.kubernetes.io/name": "agentserve",
        "app.kubernetes.io/instance": d.name,
        "app.kubernetes.io/managed-by": r.FIELD_MANAGER,
        LABEL_DEPLOYMENT: d.name,
        LABEL_COMPONENT: component,
    }


def worker_group_name(model: str) -> str:
    """KubeRay worker group (and Ray custom resource) of a model: DNS-safe, unique, short."""
    slug = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")[:24].strip("-") or "model"
    return f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:6]}"


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


def _shm(d: r.Desired) -> dict[str, Any]:
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if d.kube.shm_size:
        empty_dir["sizeLimit"] = d.kube.shm_size
    return {"name": "shm", "emptyDir": empty_dir}


def _volumes(d: r.Desired, *, worker: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): spec and /dev/shm everywhere; model volume and hub
    cache (the claim, or a per-pod emptyDir when Hugging Face ids are downloaded without
    one) on workers only."""
    configmap = {"name": f"{d.name}-spec"}
    volumes: list[dict[str, Any]] = [{"name": "spec", "configMap": configmap}, _shm(d)]
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if not worker:
        return volumes, mounts
    if d.kube.model_volume is not None:
        mv = d.kube.model_volume
        claim = {"claimName": mv.claim_name, "readOnly": mv.read_only}
        volumes.append({"name": "models", "persistentVolumeClaim": claim})
        mounts.append({"name": "models", "mountPath": mv.mount_path, "readOnly": mv.read_only})
    cache = _hub_cache_path(d)
    if d.kube.hub_cache is not None:
        claim = {"claimName": d.kube.hub_cache.claim_name}
        volumes.append({"name": "hf-cache", "persistentVolumeClaim": claim})
    elif cache is not None:
        volumes.append({"name": "hf-cache", "emptyDir": {}})
    if cache is not None:
        mounts.append({"name": "hf-cache", "mountPath": cache})
    if d.kube.hub_cache is None:
        volumes.append({"name": "engine-cache", "emptyDir": {}})
        mounts.append({"name": "engine-cache", "mountPath": ENGINE_CACHE_MOUNT})
    return volumes, mounts


def _engine_cache_path(d: r.Desired) -> str:
    """VLLM_CACHE_ROOT of the worker pods: beside the hub cache on its claim, else per pod."""
    if d.kube.hub_cache is not None:
        return f"{d.kube.hub_cache.mount_path.rstrip('/')}/vllm"
    return ENGINE_CACHE_MOUNT


def _hub_cache_path(d: r.Desired) -> str | None:
    """HF_HOME of the worker pods: the claim's mount, a per-pod emptyDir when a Hugging Face
    id is to be downloaded without a claim, or None (nothing to download)."""
    if d.kube.hub_cache is not None:
        return d.kube.hub_cache.mount_path
    return HUB_CACHE_MOUNT if r.hub_ids(d.spec) and not d.kube.hub_offline else None


def _env(d: r.Desired, *, worker: bool) -> list[dict[str, Any]]:
    """Pod environment: the spec path, the user's `env`, and on workers the Hugging Face hub
    settings (offline unless a source is a Hugging Face id to download; HF_HOME on the cache;
    HF_TOKEN from an optional Secret key: a public model starts without it) and vLLM's
    compile cache (VLLM_CACHE_ROOT)."""
    env: list[dict[str, Any]] = [{"name": "AGENTSERVE_SPEC", "value": f"{SPEC_MOUNT}/spec.yaml"}]
    env += [{"name": k, "value": v} for k, v in sorted(d.kube.env.items())]
    if not worker:
        return env
    if d.kube.hub_offline or not r.hub_ids(d.spec):
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    cache = _hub_cache_path(d)
    if cache is not None:
        env.append({"name": "HF_HOME", "value": cache})
    if "VLLM_CACHE_ROOT" not in d.kube.env:  # the user's own location wins
        env.append({"name": "VLLM_CACHE_ROOT", "value": _engine_cache_path(d)})
    if d.kube.hf_token_secret:
        ref = {"name": d.kube.hf_token_secret, "key": d.kube.hf_token_key, "optional": True}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def _env_from(d: r.Desired) -> list[dict[str, Any]]:
    return [{"secretRef": {"name": s}} for s in d.kube.env_from_secrets] + [
        {"configMapRef": {"name": c}} for c in d.kube.env_from_config_maps
    ]


def _container(d: r.Desired, name: str, resources: dict[str, Any], *, worker: bool,
               capabilities_add: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    _, mounts = _volumes(d, worker=worker)
    container = {
        "name": name,
        "image": d.kube.image,
        "imagePullPolicy": d.kube.image_pull_policy,
        "env": _env(d, worker=worker),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": container_security_context(capabilities_add),
    }
    if _env_from(d):
        container["envFrom"] = _env_from(d)
    return container


def _pod_template(d: r.Desired, container: dict[str, Any], extra_labels: dict[str, str], *,
                  worker: bool, **spec: Any) -> dict[str, Any]:  # fmt: skip
    volumes, _ = _volumes(d, worker=worker)
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        # Ray itself needs no Kubernetes API access: no token in the Ray containers (the
        # head's autoscaler sidecar gets one of its own, AUTOSCALER_TOKEN_VOLUME); syscalls
        # filtered by the runtime's profile (the root file system stays writable: Ray
        # writes /tmp/ray and its sessions). fsGroup: a fresh block volume (the Hugging
        # Face cache claim) has a root-owned root directory; the kubelet gives it this
        # group, which the images' user 1000 gets as a supplementary group, so the cache
        # is writable (once per volume: OnRootMismatch skips the walk of a filled cache)
        "automountServiceAccountToken": False,
        "securityContext": {
            "seccompProfile": {"type": "RuntimeDefault"},
            "fsGroup": POD_FS_GROUP,
            "fsGroupChangePolicy": "OnRootMismatch",
        },
    }
    if d.kube.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in d.kube.image_pull_secrets]
    if d.kube.priority_class_name:
        pod["priorityClassName"] = d.kube.priority_class_name
    pod.update(spec)
    return {"metadata": {"labels": {**labels(d, "ray"), **extra_labels}}, "spec": pod}


def _autoscaler_token_volume() -> dict[str, Any]:
    """The service-account token, CA and namespace, as the kubelet would mount them
    (expirationSeconds 3607 like its own kube-api-access volume; the autoscaler re-reads
    the token periodically, so rotation is fine)."""
    return {
        "name": AUTOSCALER_TOKEN_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }  # fmt: skip


def container_security_context(capabilities_add: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every container KubeRay runs for a deployment, the autoscaler sidecar included (the
    one holding a service-account token): no privilege escalation, capabilities dropped
    (PodSecurity "restricted" admits nothing less), a non-root user."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if capabilities_add:
        capabilities["add"] = list(capabilities_add)
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities, "runAsNonRoot": True}


def autoscaler_volume_mounts() -> list[dict[str, Any]]:
    """autoscalerOptions.volumeMounts: the token volume where Ray's KubeRay node provider
    reads it (ray/autoscaler/_private/kuberay/node_provider.py, IN_CLUSTER_TOKEN_PATH)."""
    return [{"name": AUTOSCALER_TOKEN_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}]


def head_group(d: r.Desired, admin_ports: list[tuple[str, int]]) -> dict[str, Any]:
    """Ray head: GCS, dashboard, Serve controller, proxy and ingress (with its admin ports);
    never GPUs, never weights; scheduled by kubernetes.head_* settings."""
    size = {"cpu": str(d.kube.head_cpus), "memory": d.kube.head_memory}
    container = _container(d, "ray-head", {"requests": size, "limits": dict(size)}, worker=False)
    container["env"] += [POD_IP_ENV, *salt_env(d.name)]  # the ingress replicas run here
    container["ports"] = [
        {"name": "gcs", "containerPort": 6379},
        {"name": "dashboard", "containerPort": DASHBOARD_PORT},
        {"name": "client", "containerPort": 10001},
        {"name": "serve", "containerPort": d.spec.server.port},
        {"name": "metrics", "containerPort": RAY_METRICS_PORT},
        *({"name": name, "containerPort": port} for name, port in admin_ports),
    ]
    spec: dict[str, Any] = _scheduling(
        d.kube.head_node_selector, d.kube.head_tolerations, d.kube.head_affinity
    )
    template = _pod_template(d, container, {}, worker=False, **spec)
    template["spec"]["volumes"].append(_autoscaler_token_volume())
    return {
        # The dashboard (8265) and its agent (52365) listen on 0.0.0.0: KubeRay's probes
        # exec `wget http://localhost:<port>/...` inside the pod, and KubeRay's operator
        # submits the Serve config through the head Service (the pod IP); a bind to the pod
        # IP alone fails the probes (the head never gets Ready). Who can reach them is
        # limited by the NetworkPolicy (KubeRay's operator and this deployment's Ray pods
        # only) and, on KubeRay >= 1.5, by Ray token auth (authOptions).
        "rayStartParams": {
            "dashboard-host": "0.0.0.0",
            "dashboard-agent-listen-port": str(DASHBOARD_AGENT_PORT),
            "metrics-export-port": str(RAY_METRICS_PORT),
            "num-gpus": "0",
            "resources": "'" + json.dumps({HEAD_RESOURCE: 100}) + "'",
        },
        "template": template,
    }


def _scheduling(node_selector: dict[str, str], tolerations: list[TolerationSpec],
                affinity: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [toleration(t) for t in tolerations]
    if affinity:
        spec["affinity"] = affinity
    return spec


def worker_group(d: r.Desired, model: ModelSpec) -> dict[str, Any]:
    """One KubeRay worker group per model: one Serve replica per nodes_per_replica pods,
    each pod with num_gpus / nodes_per_replica GPUs (all of a TP x PP replica's GPUs).

    `replicas` is left out: Ray's autoscaler scales the RayCluster that KubeRay makes from
    this template, between minReplicas and maxReplicas (pods: replicas x nodes).
    """
    group = worker_group_name(model.name)
    rs = model.replicas
    nodes = rs.nodes_per_replica
    gpus = gpus_per_node(model)
    cpus = max(1, math.ceil(rs.num_cpus))
    size: dict[str, str] = {"cpu": str(cpus), "memory": d.kube.worker_memory}
    if gpus:
        size[rs.gpu_resource_name] = str(gpus)
    size.update(rs.extra_resources)
    caps = ("IPC_LOCK",) if rs.ipc_lock else ()
    resources = {"requests": size, "limits": dict(size)}
    container = _container(d, "ray-worker", resources, worker=True, capabilities_add=caps)
    # `serve`: KubeRay's worker readiness probe checks the Serve proxy on the container port
    # of that name (else 8000). A worker without a proxy (in a replica spread over pods,
    # every pod but the replica's own) stays unready: KubeRay's serve Service selects every
    # Ready worker, so Ready must mean "takes traffic" (status counts such replicas).
    container["ports"] = [
        {"name": "serve", "containerPort": d.spec.server.port},
        {"name": "metrics", "containerPort": RAY_METRICS_PORT},
    ]
    spec = _scheduling(rs.node_selector, rs.tolerations, rs.affinity)
    if d.kube.runtime_class_name:
        spec["runtimeClassName"] = d.kube.runtime_class_name
    prefetch = _prefetch_container(d, model, size)
    if prefetch is not None:
        spec["initContainers"] = [prefetch]
    return {
        "groupName": group,
        "minReplicas": rs.min_replicas * nodes,
        "maxReplicas": rs.max_replicas * nodes,
        "rayStartParams": {
            "num-cpus": str(cpus),
            "num-gpus": str(gpus),
            "metrics-export-port": str(RAY_METRICS_PORT),
            "resources": "'" + json.dumps({group: 1}) + "'",
        },
        "template": _pod_template(d, container, {LABEL_MODEL: group}, worker=True, **spec),
    }


def prefetch_args(model: ModelSpec) -> list[str]:
    """`repo[@revision]` of each Hugging Face id the model's replica loads (its source,
    drafter and LoRA adapters)."""
    from agentserve.sources.models import is_hub_id

    refs = [(model.source, model.revision)]
    if model.drafter.enabled and model.drafter.path:
        refs.append((model.drafter.path, model.drafter.revision))
    refs += [(source, None) for source in (model.lora.adapters if model.lora else {}).values()]
    return [f"{repo}@{rev}" if rev else repo for repo, rev in refs if is_hub_id(repo)]


def _prefetch_container(
    d: r.Desired, model: ModelSpec, size: dict[str, str]
) -> dict[str, Any] | None:
    """Init container that downloads the model's Hugging Face ids into the hub cache before
    Ray starts (agentserve.sources.prefetch): a multi-GB download then never runs inside the Serve
    replica's constructor, where Serve's health checks and timeouts would cut it short;
    a failed download restarts this container with backoff and shows in the pod's state.
    CPU and memory as the Ray container (an init container adds nothing to the pod's
    requests then); no GPUs."""
    args = prefetch_args(model)
    if not args or _hub_cache_path(d) is None:
        return None
    cpu_mem = {k: v for k, v in size.items() if k in ("cpu", "memory")}
    resources = {"requests": cpu_mem, "limits": dict(cpu_mem)}
    container = _container(d, "hub-prefetch", resources, worker=True)
    container["command"] = ["python", "-m", "agentserve.sources.prefetch", *args]
    return container

"""The AgentServe custom resource: names, the `kubernetes` block, and CR -> validated Desired.

A CR's `spec` is a DeploymentSpec plus one `kubernetes` object (image, model volume, API-key
Secret, sizes). Tenants may leave `api_key_sha256` out when the referenced Secret holds their
key; the operator hashes it, so keys never appear in the CR, the ConfigMap or the RayService.
Speculation follows the rule `agentserve up` follows (spec.defaults.resolve_drafters): a
model that leaves `drafter.enabled` unset speculates with the method measured fastest through
the server on the kind of machine its replicas run on ("cuda" for GPU replicas; CPU replicas
on a cluster are of no known kind, so plain decoding), and each drafter left at
`speculation_schedule: auto` gets its batch-size schedule, so the ConfigMap and RayService
carry both.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from agentserve.api.auth import KEY_SALT_ENV, salted_key_hash
from agentserve.api.cache_salt import KEY_ENV as CACHE_SALT_KEY_ENV
from agentserve.sources.models import is_hub_id
from agentserve.spec import (
    DeploymentSpec,
    SpecError,
    TolerationSpec,
    hash_api_key,
    spec_from_dict,
)
from agentserve.spec.defaults import resolve_drafters
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from agentserve_operator.cluster_spec import (
    GcsFaultToleranceSpec,
    HubCacheSpec,
    IncrementalUpgradeSpec,
    ModelVolumeSpec,
    UpgradeStrategy,
)

__all__ = [
    "Desired",
    "GcsFaultToleranceSpec",
    "InvalidResource",
    "KubernetesSpec",
    "desired_from_cr",
    "hub_ids",
    "kube_spec_of",
    "secret_text",
]

GROUP = "agentserve.dev"
VERSION = "v1alpha1"
KIND = "AgentServe"
PLURAL = "agentserves"
SINGULAR = "agentserve"
SHORT_NAMES = ["as", "agsv"]
API_VERSION = f"{GROUP}/{VERSION}"
FIELD_MANAGER = "agentserve-operator"
DEFAULT_IMAGE = "ghcr.io/agentserve/agentserve:0.1.0-cuda"
DEFAULT_RAY_VERSION = "2.60.0"
IN_POD_HOST = "0.0.0.0"  # the Serve proxy must listen on the pod IP for the Service to reach it
# /metrics and /status: the ingress replica (pinned to the head pod) listens here
DEFAULT_METRICS_PORT = 9400
CLUSTER_INGRESS_REPLICAS = 2  # one ingress replica can die without taking every stream
# on KubeRay's operator pods whether installed by its Helm chart (name: kuberay-operator,
# component: kuberay-operator) or its kustomize manifests (name: kuberay, component:
# kuberay-operator), v1.4 to v1.6
KUBERAY_OPERATOR_LABELS = {"app.kubernetes.io/component": "kuberay-operator"}
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# set by the operator itself (manifests/pods.py): `env` may not replace them
RESERVED_ENV = frozenset({"AGENTSERVE_SPEC", "AGENTSERVE_POD_IP", "HF_HOME", "HF_HUB_OFFLINE",
                          "HF_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", KEY_SALT_ENV,
                          CACHE_SALT_KEY_ENV})  # fmt: skip


class _K8s(BaseModel):
    model_config = ConfigDict(extra="forbid")


_Namespace = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
]


class KubernetesSpec(_K8s):
    """Cluster-side settings of one AgentServe (not part of DeploymentSpec)."""

    image: str = Field(DEFAULT_IMAGE, min_length=1, description="Image of the Ray pods.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the Ray pods."
    )
    ray_version: str = Field(
        DEFAULT_RAY_VERSION, min_length=1, description="Ray version inside the image."
    )
    api_key_secret: str | None = Field(
        None,
        max_length=253,
        description="Secret in the same namespace whose data maps tenant name -> API key; "
        "fills tenants' api_key_sha256.",
    )
    model_volume: ModelVolumeSpec | None = Field(None, description="Volume with model weights.")
    hub_cache: HubCacheSpec | None = Field(
        None,
        description="Volume with the Hugging Face cache for Hugging Face id sources; null = "
        "each pod downloads into its own container file system.",
    )
    hf_token_secret: str | None = Field(
        None,
        max_length=253,
        description="Secret in the same namespace with a Hugging Face token (key "
        "hf_token_key), passed to the pods as HF_TOKEN, for gated or private repositories.",
    )
    hf_token_key: str = Field(
        "HF_TOKEN", min_length=1, max_length=253, description="Key of the token in that Secret."
    )
    hub_offline: bool = Field(
        False,
        description="Never download (HF_HUB_OFFLINE=1): Hugging Face id sources must already "
        "be in hub_cache. Always on when no source is a Hugging Face id.",
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", description="Type of the OpenAI endpoint Service."
    )
    head_cpus: int = Field(2, ge=1, description="CPU cores of the Ray head pod (no GPUs).")
    head_memory: str = Field("8Gi", pattern=_QUANTITY, description="Memory of the Ray head pod.")
    worker_memory: str = Field(
        "32Gi", pattern=_QUANTITY, description="Memory of each model replica pod."
    )
    monitoring: bool = Field(
        True,
        description="Create a ServiceMonitor (ingress metrics) and a PodMonitor (Ray and vLLM "
        "metrics of every Ray pod) when the Prometheus Operator CRDs exist.",
    )
    kuberay_version: str | None = Field(
        None,
        pattern=r"^v?1\.[0-9]+(\.[0-9]+)?$",
        description="KubeRay version to render the RayService for (1.4, 1.5 or 1.6); null = "
        "read from the installed RayService CRD. 1.4 has no Ray token auth (authOptions).",
    )
    kuberay_namespace: str = Field(
        "kuberay-system",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="Namespace of KubeRay's operator: only its pods (labels "
        "kuberay_operator_labels) in this namespace may reach the Ray "
        "dashboard and dashboard agent (NetworkPolicy).",
    )
    monitoring_namespaces: list[_Namespace] = Field(
        default_factory=list,
        description="Namespaces whose pods may scrape the admin ports (/metrics, /status: "
        "tenant names are in the metrics) and Ray's metrics port (NetworkPolicy), e.g. "
        "[monitoring]; empty = pods of every namespace.",
    )
    kuberay_operator_labels: dict[str, str] = Field(
        default_factory=lambda: dict(KUBERAY_OPERATOR_LABELS),
        min_length=1,
        description="Labels of KubeRay's operator pods, all required (NetworkPolicy "
        "podSelector). The default, app.kubernetes.io/component=kuberay-operator, is on "
        "the pods of both KubeRay installs: its Helm chart and its kustomize manifests "
        "(ray-operator/config/default, whose pods carry app.kubernetes.io/name=kuberay).",
    )
    upgrade_strategy: UpgradeStrategy = Field(
        "auto",
        description="RayService upgradeStrategy for changes under the Ray cluster (image, "
        "pod settings, resources); replica counts and the Serve config update in place "
        "whatever it is. auto: NewClusterWithIncrementalUpgrade where KubeRay >= 1.5 and "
        "incremental_upgrade is set, else None. None: such changes wait until the "
        "AgentServe is recreated (never more GPUs). NewCluster: a full second cluster, GPUs "
        "included, then traffic switches (zero downtime, twice the GPUs meanwhile). "
        "docs/kubernetes.md, Upgrades.",
    )
    incremental_upgrade: IncrementalUpgradeSpec | None = Field(
        None, description="Settings of NewClusterWithIncrementalUpgrade (KubeRay >= 1.5)."
    )
    worker_max_unavailable: int | None = Field(
        1,
        ge=1,
        description="PodDisruptionBudget of the model replica pods: at most this many evicted "
        "at once by a node drain (not by Ray's autoscaler); null = no PodDisruptionBudget.",
    )
    gcs_fault_tolerance: GcsFaultToleranceSpec | None = Field(
        None, description="GCS fault tolerance with an external Redis; null = off."
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="Secrets for pulling `image` (head and workers)."
    )
    priority_class_name: str | None = Field(
        None, max_length=253, description="PriorityClass of the Ray pods (head and workers)."
    )
    runtime_class_name: str | None = Field(
        None,
        max_length=253,
        description="RuntimeClass of the model replica pods (e.g. nvidia); the head, which "
        "has no GPUs, keeps the default.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables of every Ray container (e.g. NCCL_DEBUG, "
        "NCCL_SOCKET_IFNAME, NCCL_IB_HCA); the operator's own (AGENTSERVE_*, HF_*, "
        "RAY_AUTH_*) cannot be replaced.",
    )
    env_from_secrets: list[str] = Field(
        default_factory=list,
        description="Secrets in the same namespace whose every key becomes an environment "
        "variable of every Ray container (envFrom).",
    )
    env_from_config_maps: list[str] = Field(
        default_factory=list,
        description="ConfigMaps whose every key becomes an environment variable of every Ray "
        "container (envFrom).",
    )
    shm_size: str | None = Field(
        None,
        pattern=_QUANTITY,
        description="Size limit of /dev/shm (a memory-backed emptyDir, counted against the "
        "pod's memory) in the Ray pods; null = no limit beyond the pod's memory. vLLM and "
        "NCCL use it between the processes of a tensor-parallel replica.",
    )
    head_node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the Ray head pod requires."
    )
    head_tolerations: list[TolerationSpec] = Field(
        default_factory=list, description="Tolerations of the Ray head pod."
    )
    head_affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Affinity of the Ray head pod (a Kubernetes core/v1 Affinity, as is).",
    )

    @field_validator("kuberay_operator_labels")
    @classmethod
    def _label_selector(cls, labels: dict[str, str]) -> dict[str, str]:
        bad = [f"{k}={v}" for k, v in labels.items()
               if not k or len(k) > 253 or not re.match(_LABEL_VALUE, v)]  # fmt: skip
        if bad:
            raise ValueError(f"not Kubernetes labels: {', '.join(bad)}")
        return labels

    @field_validator("env")
    @classmethod
    def _no_reserved_env(cls, env: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(env) & RESERVED_ENV)
        if bad:
            raise ValueError(f"set by the operator, cannot be replaced: {', '.join(bad)}")
        invalid = [k for k in env if not re.match(_ENV_NAME, k)]
        if invalid:
            raise ValueError(f"not environment variable names: {', '.join(invalid)}")
        return env


class InvalidResource(SpecError):
    """A CR the operator cannot deploy (bad spec, missing tenant key); permanent until edited."""


@dataclass(frozen=True)
class Desired:
    """What one CR asks for, validated: identity, the DeploymentSpec and the kubernetes block."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: DeploymentSpec
    kube: KubernetesSpec


def kube_spec_of(cr: dict[str, Any]) -> KubernetesSpec:
    """The CR's validated `kubernetes` block; raises InvalidResource."""
    return _kube_spec((cr.get("spec") or {}).get("kubernetes") or {})


def replica_machine(spec) -> str:
    """The kind of machine a cluster deployment's replicas run on, for the speculation
    default: "cuda" when any model asks for GPUs, else "cpu" (a cluster's CPU nodes are of
    no kind the operator can know, and no default is measured for an unknown kind)."""
    return "cuda" if any(m.replicas.num_gpus > 0 for m in spec.models) else "cpu"


def desired_from_cr(cr: dict[str, Any], secret_data: dict[str, str] | None, *,
                    key_salt: str | None = None) -> Desired:  # fmt: skip
    """Validate a CR body; `secret_data` is the API-key Secret's decoded data (None: absent),
    its keys hashed as HMAC-SHA256(key_salt, key) (None: plain SHA-256).

    Raises InvalidResource naming each failing field. The CR's `server.host` is replaced by
    0.0.0.0 (the in-pod bind address), so a cluster deployment always needs tenants; an
    unset `server.metrics_port` becomes DEFAULT_METRICS_PORT (admin endpoints never share
    the API port in a cluster) and an unset `server.ingress_replicas`
    CLUSTER_INGRESS_REPLICAS.
    """
    meta = cr.get("metadata", {})
    _check_name(meta.get("name") or "")
    raw = dict(cr.get("spec") or {})
    raw.setdefault("name", meta.get("name"))  # Serve app and metrics named after the CR
    kube = _kube_spec(raw.pop("kubernetes", None) or {})
    raw["tenants"] = _tenants_with_hashes(raw.get("tenants") or [], kube, secret_data, key_salt)
    if not raw["tenants"]:
        raise InvalidResource(
            "invalid AgentServe: tenants: a cluster deployment is reachable from the network, "
            "so it needs at least one tenant; reference the keys with kubernetes.api_key_secret",
            [("tenants", "at least one tenant is required in a cluster")],
        )
    raw["server"] = {**(raw.get("server") or {}), "host": IN_POD_HOST}
    if raw["server"].get("metrics_port") is None:
        raw["server"]["metrics_port"] = DEFAULT_METRICS_PORT
    if raw["server"].get("ingress_replicas") is None:
        raw["server"]["ingress_replicas"] = CLUSTER_INGRESS_REPLICAS
    try:
        spec = spec_from_dict(raw, source=f"AgentServe {meta.get('name')}")
        spec, _ = resolve_drafters(spec, machine=replica_machine(spec))
    except SpecError as err:
        raise InvalidResource(str(err), err.errors) from None
    if kube.hub_offline and kube.hub_cache is None and hub_ids(spec):
        raise InvalidResource(
            "invalid AgentServe: kubernetes.hub_offline: the Hugging Face ids "
            f"{', '.join(hub_ids(spec))} can only be read from a cache: set kubernetes.hub_cache",
            [("kubernetes.hub_cache", "required by hub_offline with Hugging Face id sources")],
        )
    return Desired(
        name=meta["name"],
        namespace=meta.get("namespace", "default"),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation", 1)),
        spec=spec,
        kube=kube,
    )


# KubeRay refuses a RayService whose name is not a DNS-1035 label or is longer than its
# MaxRayServiceNameLength (53 - 6: room for the RayCluster's suffix); the RayService is named
# after the AgentServe, so such a name is refused here, saying why, not left waiting.
MAX_NAME_LENGTH = 47
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _check_name(name: str) -> None:
    if len(name) > MAX_NAME_LENGTH or not _DNS_1035.match(name):
        raise InvalidResource(
            f"invalid AgentServe name {name!r}: its RayService takes the name, and KubeRay "
            f"accepts only a DNS-1035 label (lower-case letters, digits and '-', starting "
            f"with a letter) of at most {MAX_NAME_LENGTH} characters",
            [("metadata.name", f"a DNS-1035 label of at most {MAX_NAME_LENGTH} characters")],
        )


def hub_ids(spec: DeploymentSpec) -> list[str]:
    """The Hugging Face ids among the spec's model sources and drafter paths."""
    ids = [m.source for m in spec.models if is_hub_id(m.source)]
    ids += [m.drafter.path for m in spec.models if m.drafter.path and is_hub_id(m.drafter.path)]
    return ids


def _kube_spec(raw: dict[str, Any]) -> KubernetesSpec:
    try:
        return KubernetesSpec.model_validate(raw)
    except ValidationError as err:
        pairs = [
            ("kubernetes." + ".".join(str(p) for p in e["loc"]), e["msg"])
            for e in err.errors(include_url=False)
        ]
        lines = [f"  {path}: {msg}" for path, msg in pairs]
        raise InvalidResource("\n".join(["invalid AgentServe:", *lines]), pairs) from None


def secret_text(name: str, data: dict[str, str] | None) -> dict[str, str]:
    """A Secret's `data` (base64 values) as text; a value that is not UTF-8 (binary: an API
    key never is) is an InvalidResource naming the Secret and key, never a crash."""
    out = {}
    for key, value in (data or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidResource(
                f"invalid AgentServe: Secret {name!r}: the value of key {key!r} is not "
                "UTF-8 text (API keys and tokens are text)",
                [(f"Secret/{name}", f"key {key!r} is not UTF-8 text")],
            ) from None
    return out


def _tenants_with_hashes(
    tenants: list[Any],
    kube: KubernetesSpec,
    secret_data: dict[str, str] | None,
    key_salt: str | None = None,
) -> list[Any]:
    """Fill each tenant's missing api_key_sha256 from the Secret (keyed by tenant name),
    salted with `key_salt` when given."""
    if kube.api_key_secret and secret_data is None:
        raise InvalidResource(
            f"kubernetes.api_key_secret: Secret {kube.api_key_secret!r} not found",
            [("kubernetes.api_key_secret", "Secret not found")],
        )
    filled, problems = [], []
    for i, tenant in enumerate(tenants):
        if not isinstance(tenant, dict) or tenant.get("api_key_sha256"):
            filled.append(tenant)
            continue
        key = (secret_data or {}).get(str(tenant.get("name")), "")
        if not key:
            where = f"Secret {kube.api_key_secret!r}" if kube.api_key_secret else "no Secret"
            problems.append(
                (
                    f"tenants[{i}].api_key_sha256",
                    f"missing, and {where} has no key named {tenant.get('name')!r}",
                )
            )
            continue
        key = key.strip()
        digest = salted_key_hash(key_salt, key) if key_salt else hash_api_key(key)
        filled.append({**tenant, "api_key_sha256": digest})
    if problems:
        lines = [f"  {path}: {msg}" for path, msg in problems]
        raise InvalidResource("\n".join(["invalid AgentServe:", *lines]), problems)
    return filled

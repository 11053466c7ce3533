"""What an AgentServe may reference: only Secrets and PersistentVolumeClaims of its own
namespace that carry the label `agentserve.dev/allow-reference: "true"`.

The operator reads Secrets and the Ray pods it creates mount volumes and project Secrets
with the operator's rights, not the rights of whoever wrote the CR. Without this check, a
user allowed to create an AgentServe but not to read Secrets could have any Secret of the
namespace projected into pods running an image of their choosing (hf_token_secret,
env_from_secrets), any PVC mounted read-write (model_volume, hub_cache), or the SHA-256 of
any Secret value written into a ConfigMap (api_key_secret). The label is the consent of
whoever may edit the Secret or claim (docs/kubernetes.md, "Trust model").
"""

from __future__ import annotations

from typing import Any, Protocol

from agentserve_operator import resource as r
from agentserve_operator.plan import ObjectRef

__all__ = ["ALLOW_LABEL", "OPTIONAL_FIELDS", "check_references", "references"]

ALLOW_LABEL = "agentserve.dev/allow-reference"
# references the pods mark `optional: true`: absent, the deployment runs without them (a
# public model needs no Hugging Face token); present, they still need the label
OPTIONAL_FIELDS = frozenset({"kubernetes.hf_token_secret"})
API_VERSION = {"Secret": "v1", "PersistentVolumeClaim": "v1"}


class _Getter(Protocol):
    def get(self, ref: ObjectRef) -> dict[str, Any] | None: ...


def references(kube: r.KubernetesSpec) -> list[tuple[str, str, str]]:
    """(field, kind, name) of every Secret and claim the `kubernetes` block names.
    image_pull_secrets are left out: the kubelet sends them only to the registry they name."""
    refs = [("kubernetes.api_key_secret", "Secret", kube.api_key_secret),
            ("kubernetes.hf_token_secret", "Secret", kube.hf_token_secret)]  # fmt: skip
    refs += [(f"kubernetes.env_from_secrets[{i}]", "Secret", name)
             for i, name in enumerate(kube.env_from_secrets)]  # fmt: skip
    if kube.gcs_fault_tolerance is not None:
        refs.append(("kubernetes.gcs_fault_tolerance.redis_password_secret", "Secret",
                     kube.gcs_fault_tolerance.redis_password_secret))  # fmt: skip
    for field, volume in (("model_volume", kube.model_volume), ("hub_cache", kube.hub_cache)):
        if volume is not None:
            refs.append((f"kubernetes.{field}.claim_name", "PersistentVolumeClaim",
                         volume.claim_name))  # fmt: skip
    return [(field, kind, name) for field, kind, name in refs if name]


def check_references(cluster: _Getter, namespace: str, kube: r.KubernetesSpec) -> None:
    """Raise InvalidResource naming every referenced Secret or claim that is absent (unless
    its field is in OPTIONAL_FIELDS) or not labelled ALLOW_LABEL=true (nothing is deployed
    then)."""
    problems = []
    for field, kind, name in references(kube):
        obj = cluster.get(ObjectRef(API_VERSION[kind], kind, namespace, name))
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        if obj is None and field in OPTIONAL_FIELDS:
            continue  # the pod's secretKeyRef is optional: it starts without the token
        if obj is None:
            problems.append((field, f"{kind} {name!r} not found"))
        elif labels.get(ALLOW_LABEL) != "true":
            problems.append((field, f"{kind} {name!r} is not labelled {ALLOW_LABEL}=true "
                             f"(kubectl -n {namespace} label {kind.lower()} {name} "
                             f"{ALLOW_LABEL}=true, by whoever may share it)"))  # fmt: skip
    if problems:
        lines = [f"  {field}: {msg}" for field, msg in problems]
        raise r.InvalidResource("\n".join(["invalid AgentServe:", *lines]), problems)

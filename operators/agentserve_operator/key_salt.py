"""The salt of one AgentServe's API-key hashes: a Secret `<name>-key-salt` (key `salt`, 64
random hex characters) that the operator creates once, owned by the AgentServe; its key
`cache` is the prefix-cache salt key every ingress replica shares (AGENTSERVE_CACHE_SALT_KEY,
agentserve.api.cache_salt), so tenants' cached prefixes survive a head pod restart.

The operator hashes the keys of `api_key_secret` as HMAC-SHA256(salt, key)
(agentserve.api.auth.salted_key_hash), so the ConfigMap and RayService, which more people
may read than the Secret, hold hashes nobody can test guesses against; the head pod (where
the ingress replicas run) reads the salt as AGENTSERVE_API_KEY_SALT. The salt never
changes: a new one would change every hash at once while the pods still have the old one.
"""

from __future__ import annotations

import secrets
from typing import Any, Protocol

from agentserve.api.auth import KEY_SALT_ENV
from agentserve.api.cache_salt import KEY_ENV as CACHE_KEY_ENV

from agentserve_operator import resource as r

__all__ = ["SALT_KEY", "ensure_salt", "head_pods_have_salt", "salt_env", "salt_secret_name"]

SALT_KEY = "salt"
CACHE_KEY = "cache"


class _Secrets(Protocol):
    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None: ...
    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...


def salt_secret_name(name: str) -> str:
    """The salt Secret of the AgentServe `name`."""
    return f"{name}-key-salt"


def salt_env(name: str) -> list[dict[str, Any]]:
    """The head container's AGENTSERVE_API_KEY_SALT and AGENTSERVE_CACHE_SALT_KEY, from the
    salt Secret."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": salt_secret_name(name), "key": key}}}
        for env, key in ((KEY_SALT_ENV, SALT_KEY), (CACHE_KEY_ENV, CACHE_KEY))
    ]


def ensure_salt(cluster: _Secrets, cr: dict[str, Any]) -> str:
    """The CR's salt, creating its Secret (owned by the CR) when absent. A create that
    races another raises RetriableClusterError (409): the retry reads the winner's."""
    meta = cr["metadata"]
    namespace, name = meta.get("namespace", "default"), salt_secret_name(meta["name"])
    data = cluster.read_secret(namespace, name)
    salt = (data or {}).get(SALT_KEY, "")
    if len(salt) >= 32 and (data or {}).get(CACHE_KEY):
        return salt
    salt = secrets.token_hex(32)
    owner = {"apiVersion": r.API_VERSION, "kind": r.KIND, "name": meta["name"],
             "uid": meta.get("uid", ""), "controller": True,
             "blockOwnerDeletion": True}  # fmt: skip
    cluster.create({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner],
                     "labels": {"app.kubernetes.io/managed-by": r.FIELD_MANAGER}},
        "type": "Opaque",
        "stringData": {SALT_KEY: salt, CACHE_KEY: secrets.token_hex(32)},
    })  # fmt: skip
    return salt


def head_pods_have_salt(pods: list[dict[str, Any]]) -> bool:
    """Whether every running head pod (ray.io/node-type=head) has AGENTSERVE_API_KEY_SALT:
    true with none. Until then (pods started by an operator without salts, not yet
    replaced) the keys stay plain SHA-256, which those ingresses can still check."""
    for pod in pods:
        if (pod.get("metadata") or {}).get("labels", {}).get("ray.io/node-type") != "head":
            continue
        containers = (pod.get("spec") or {}).get("containers") or []
        names = {e.get("name") for c in containers for e in c.get("env") or []}
        if KEY_SALT_ENV not in names:
            return False
    return True

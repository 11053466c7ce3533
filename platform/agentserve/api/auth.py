"""API key -> tenant: keys are compared as SHA-256 hashes in constant time.

A tenant's stored hash is the key's plain SHA-256 (written by hand, `agentserve up`) or,
on Kubernetes, HMAC-SHA256 keyed by the deployment's salt (`salted_key_hash`: the operator
fills hashes from the key Secret so; the salt reaches the ingress as AGENTSERVE_API_KEY_SALT
from a Secret, so a reader of the ConfigMap cannot test guesses against the hashes).

With tenants configured every request needs `Authorization: Bearer <key>`. With none
(open mode, which the spec only allows on a loopback address) every request belongs to
the tenant "default" and any key, or none, is accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass

from agentserve.api.errors import AuthenticationError
from agentserve.spec import DeploymentSpec, RateLimitSpec, SLASpec, TenantSpec

__all__ = ["KEY_SALT_ENV", "OPEN_TENANT", "Tenant", "TenantResolver", "salted_key_hash"]

OPEN_TENANT = "default"
KEY_SALT_ENV = "AGENTSERVE_API_KEY_SALT"


def salted_key_hash(salt: str, key: str) -> str:
    """Lowercase hex HMAC-SHA256(salt, key): the stored form of a key under a salt."""
    return hmac.new(salt.encode(), key.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Tenant:
    """Who a request belongs to, with its SLA and limits."""

    name: str
    sla: SLASpec
    rate_limit: RateLimitSpec
    sla_class: str | None = None


class TenantResolver:
    """Maps an Authorization header to a Tenant; raises AuthenticationError (401)."""

    def __init__(self, spec: DeploymentSpec, tenants: Sequence[TenantSpec] | None = None,
                 key_salt: str | None = None):  # fmt: skip
        """`tenants` None: the spec's (none = open mode); given (the ingress's user_config,
        agentserve.tenant_config), a key is always required, even with none configured.
        `key_salt` None: $AGENTSERVE_API_KEY_SALT (unset: plain SHA-256 hashes only)."""
        self._salt = key_salt if key_salt is not None else os.environ.get(KEY_SALT_ENV) or None
        self._tenants = [
            (
                bytes.fromhex(t.api_key_sha256),
                Tenant(t.name, t.sla, t.rate_limit, t.sla_class),
            )
            for t in (spec.tenants if tenants is None else tenants)
        ]
        self._open = Tenant(OPEN_TENANT, spec.autoscaling.open_mode_sla, RateLimitSpec())
        self._open_mode = tenants is None and not self._tenants

    @property
    def open_mode(self) -> bool:
        """True when no tenants are configured (no key needed)."""
        return self._open_mode

    def tenants(self) -> list[Tenant]:
        """All tenants requests can map to."""
        return [t for _, t in self._tenants] or [self._open]

    def resolve(self, authorization: str | None) -> Tenant:
        """Tenant for the header value `Bearer <key>`.

        Every configured hash is compared with the key's plain and salted hash
        (hmac.compare_digest, no early exit), so the time taken does not reveal which
        tenant, if any, matched.
        """
        if self.open_mode:
            return self._open
        key = _bearer_key(authorization)
        digests = [hashlib.sha256(key.encode("utf-8")).digest()]
        if self._salt:
            digests.append(bytes.fromhex(salted_key_hash(self._salt, key)))
        found: Tenant | None = None
        for stored, tenant in self._tenants:
            for digest in digests:  # both forms, every tenant: no early exit
                if hmac.compare_digest(digest, stored) and found is None:
                    found = tenant
        if found is None:
            raise AuthenticationError()
        return found


def _bearer_key(authorization: str | None) -> str:
    if not authorization:
        raise AuthenticationError("Missing API key: send the header 'Authorization: Bearer <key>'.")
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationError("Malformed Authorization header: expected 'Bearer <key>'.")
    return key.strip()

"""API key -> tenant: keys are compared as SHA-256 hashes in constant time.

With tenants configured every request needs `Authorization: Bearer <key>`. With none
(open mode, which the spec only allows on a loopback address) every request belongs to
the tenant "default" and any key, or none, is accepted.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from agentserve.api.errors import AuthenticationError
from agentserve.spec import DeploymentSpec, RateLimitSpec, SLASpec, TenantSpec

__all__ = ["OPEN_TENANT", "Tenant", "TenantResolver"]

OPEN_TENANT = "default"


@dataclass(frozen=True)
class Tenant:
    """Who a request belongs to, with its SLA and limits."""

    name: str
    sla: SLASpec
    rate_limit: RateLimitSpec
    sla_class: str | None = None


class TenantResolver:
    """Maps an Authorization header to a Tenant; raises AuthenticationError (401)."""

    def __init__(self, spec: DeploymentSpec, tenants: Sequence[TenantSpec] | None = None):
        """`tenants` None: the spec's (none = open mode); given (the ingress's user_config,
        agentserve.tenant_config), a key is always required, even with none configured."""
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

        Every configured hash is compared (hmac.compare_digest, no early exit), so the
        time taken does not reveal which tenant, if any, matched.
        """
        if self.open_mode:
            return self._open
        key = _bearer_key(authorization)
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        found: Tenant | None = None
        for stored, tenant in self._tenants:
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

"""Per-tenant prefix-cache salts: the ingress sets every request's `cache_salt`, so cached
prompt prefixes are never shared across tenants (no timing side channel between them).

salt = HMAC-SHA256(server secret, tenant name \\0 client cache_salt). A client's own salt
still splits its tenant's cache further, but can never reproduce another tenant's salt:
the tenant name is always mixed in, and the secret never leaves the ingress.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["CacheSalter"]


class CacheSalter:
    """Tenant (+ client salt) -> the cache_salt the engine sees. `secret` None: a random
    one per ingress process (cached prefixes then last as long as that process)."""

    def __init__(self, secret: bytes | None = None):
        self._secret = secret or secrets.token_bytes(32)

    def salt(self, tenant: str, client_salt: str | None = None) -> str:
        message = b"%s\0%s" % (
            tenant.encode("utf-8"),
            (client_salt or "").encode("utf-8", "surrogatepass"),
        )
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

"""Per-tenant prefix-cache salts: the ingress sets every request's `cache_salt`, so cached
prompt prefixes are never shared across tenants (no timing side channel between them).

salt = HMAC-SHA256(server secret, tenant name \\0 client cache_salt). A client's own salt
still splits its tenant's cache further, but can never reproduce another tenant's salt:
the tenant name is always mixed in, and the secret never leaves the ingress.

The secret is one key every ingress replica shares (`salt_key`), so a tenant's prefixes
hit the cache through any ingress and survive an ingress restart: the key itself in
AGENTSERVE_CACHE_SALT_KEY (e.g. from a Kubernetes Secret), else the file named by
AGENTSERVE_CACHE_SALT_KEY_FILE (a mounted Secret), else a file under the local state
directory (AGENTSERVE_STATE_DIR, default the user state dir), created once with mode 0600.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["KEY_ENV", "KEY_FILE_ENV", "STATE_DIR_ENV", "CacheSalter", "salt_key"]

KEY_ENV = "AGENTSERVE_CACHE_SALT_KEY"
KEY_FILE_ENV = "AGENTSERVE_CACHE_SALT_KEY_FILE"
STATE_DIR_ENV = "AGENTSERVE_STATE_DIR"
KEY_FILE_NAME = "cache-salt.key"
MIN_KEY_BYTES = 16


class CacheSalter:
    """Tenant (+ client salt) -> the cache_salt the engine sees. `secret` None: a random
    one per process (cached prefixes then last as long as that process; tests only: the
    ingress passes `salt_key()`)."""

    def __init__(self, secret: bytes | None = None):
        self._secret = secret or secrets.token_bytes(32)

    def salt(self, tenant: str, client_salt: str | None = None) -> str:
        message = b"%s\0%s" % (
            tenant.encode("utf-8"),
            (client_salt or "").encode("utf-8", "surrogatepass"),
        )
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()


def salt_key(environ: Mapping[str, str] | None = None) -> bytes:
    """The key all ingress replicas share (see the module docstring); ValueError when a
    configured key is shorter than MIN_KEY_BYTES."""
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        return _checked(env[KEY_ENV].encode("utf-8"), KEY_ENV)
    if env.get(KEY_FILE_ENV):
        return _checked(Path(env[KEY_FILE_ENV]).read_bytes().strip(), env[KEY_FILE_ENV])
    return _local_key(_state_dir(env) / KEY_FILE_NAME)


def _state_dir(env: Mapping[str, str]) -> Path:
    if env.get(STATE_DIR_ENV):
        return Path(env[STATE_DIR_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_state_dir("agentserve"))


def _local_key(path: Path) -> bytes:
    """The key in `path`, created (0600, exclusively: concurrent starters agree) once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(100):  # another process created it: wait for its content
            key = path.read_bytes().strip()
            if key:
                return _checked(key, str(path))
            time.sleep(0.01)
        return _checked(path.read_bytes().strip(), str(path))
    with os.fdopen(fd, "wb") as out:
        out.write(secrets.token_hex(32).encode("ascii"))
    return path.read_bytes().strip()


def _checked(key: bytes, where: str) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"the cache salt key from {where} has {len(key)} bytes; it needs at least "
            f"{MIN_KEY_BYTES} (e.g. `openssl rand -hex 32`)"
        )
    return key

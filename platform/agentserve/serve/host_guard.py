"""Open-mode guard against browsers: with no API keys configured (open mode, loopback
only) any web page could otherwise drive the API, through DNS rebinding (its own name
resolving to 127.0.0.1) or a cross-site form POST.

`OpenModeGuard` (ASGI middleware, active only in open mode):
- the Host header must name a trusted host: localhost, 127.0.0.1, ::1, server.host and
  server.trusted_hosts (any port) -> else 400, code untrusted_host;
- a POST must declare `Content-Type: application/json` (a browser cannot send that
  cross-site without a CORS preflight, which this server never grants) -> else 415,
  code unsupported_media_type.
With API keys every request needs `Authorization`, which a browser does not add across
sites, so the guard stays out of the way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse

from agentserve.spec import DeploymentSpec

__all__ = ["LOOPBACK_NAMES", "OpenModeGuard", "host_name", "trusted_hosts"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def trusted_hosts(spec: DeploymentSpec) -> frozenset[str]:
    """Host names the open-mode API answers to (lowercase, no port or brackets)."""
    names = (*LOOPBACK_NAMES, spec.server.host, *spec.server.trusted_hosts)
    return frozenset(host_name(n) for n in names)


def host_name(host: str) -> str:
    """'LocalHost:8000' -> 'localhost'; '[::1]:8000' -> '::1'; '::1' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host.rstrip(".")


def _error(status: int, message: str, code: str) -> JSONResponse:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }
    return JSONResponse(body, status_code=status)


class OpenModeGuard:
    """ASGI middleware: see the module docstring. `trusted` None = not open mode (off)."""

    def __init__(self, app: Any, trusted: frozenset[str] | None = None):
        self.app = app
        self.trusted = trusted

    def refusal(self, scope: dict[str, Any]) -> JSONResponse | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if host_name(host) not in self.trusted:
            return _error(
                400,
                f"Host {host!r} is not trusted: with no API keys this server answers only "
                f"{', '.join(sorted(self.trusted))} (add names to server.trusted_hosts or "
                "--trusted-host).",
                "untrusted_host",
            )
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        if scope.get("method") == "POST" and media != "application/json":
            return _error(
                415,
                f"Content-Type must be application/json, got {media or 'none'!r}.",
                "unsupported_media_type",
            )
        return None

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and self.trusted is not None:
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

"""Admin endpoints (/metrics, /status) kept off the public API port.

`AdminGate` wraps the ingress app and decides by the port a request arrived on:
- `server.metrics_port` unset (the default): on the API port the admin paths answer only
  loopback clients (`agentserve status`, a local Prometheus); anyone else gets the 404 of
  an unknown route;
- `server.metrics_port` set: the admin paths are served only on that port (the ingress
  replica listens on `server.host:metrics_port`, see `admin_lifespan`), never on the API
  port, and that port serves nothing but them and /health.

The gate reads the ASGI scope (`server` = the listening socket, `client` = the peer);
Ray Serve's proxy forwards the client's scope to the ingress replica unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse

from agentserve.spec import DeploymentSpec

__all__ = ["ADMIN_PATHS", "AdminGate", "admin_lifespan", "is_loopback_client"]

log = logging.getLogger(__name__)
ADMIN_PATHS = frozenset({"/metrics", "/status"})
ADMIN_PORT_PATHS = ADMIN_PATHS | {"/health"}
BIND_RETRY_S = 5.0


def is_loopback_client(client: Any) -> bool:
    """True when the ASGI `client` (host, port) is a loopback address."""
    if not client:
        return False
    host = str(client[0])
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def _not_found() -> JSONResponse:
    body = {
        "error": {
            "message": "Not Found",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    return JSONResponse(body, status_code=404)


class AdminGate:
    """ASGI middleware: see the module docstring. `metrics_port` None = loopback mode."""

    def __init__(self, app: Any, metrics_port: int | None = None):
        self.app = app
        self.metrics_port = metrics_port

    def allows(self, scope: dict[str, Any]) -> bool:
        path = scope.get("path", "")
        server = scope.get("server") or (None, None)
        on_admin_port = self.metrics_port is not None and server[1] == self.metrics_port
        if on_admin_port:
            return path in ADMIN_PORT_PATHS
        if path not in ADMIN_PATHS:
            return True
        return self.metrics_port is None and is_loopback_client(scope.get("client"))

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and not self.allows(scope):
            await _not_found()(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _QuietServer:
    """uvicorn.Server that leaves signal handling to its host process (Ray's replica)."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # type: ignore[override]
                yield

        return Server(config)


def _bind(host: str, port: int, *, report: bool) -> socket.socket | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as err:
        sock.close()
        if report:
            log.error(
                "admin endpoints not served yet: cannot listen on %s:%s: %s (retrying every "
                "%g s)", host, port, err, BIND_RETRY_S,
            )  # fmt: skip
        return None
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _AdminListener:
    """Serves `app` on host:port from a task on the running loop. A port that is busy
    (e.g. the replica this one replaces still holds it) is retried every BIND_RETRY_S."""

    def __init__(self, app: Any, host: str, port: int):
        self.app, self.host, self.port = app, host, port
        self.server: Any = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        import uvicorn

        sock = _bind(self.host, self.port, report=True)
        while sock is None:
            await asyncio.sleep(BIND_RETRY_S)
            sock = _bind(self.host, self.port, report=False)
        config = uvicorn.Config(self.app, lifespan="off", log_level="warning", access_log=False)
        self.server = _QuietServer(config)
        try:
            await self.server.serve(sockets=[sock])
        finally:
            sock.close()

    async def stop(self) -> None:
        if self.server is None:
            self.task.cancel()
        else:
            self.server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.task, 5)


def admin_lifespan(spec: DeploymentSpec) -> Callable[[Any], Any]:
    """FastAPI lifespan: with server.metrics_port set, serve the same app on
    server.host:metrics_port (AdminGate limits that port to the admin paths) for the app's
    lifetime. A port that cannot be bound is logged and retried, never fatal: the API
    keeps serving."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        port = spec.server.metrics_port
        listener = None if port is None else _AdminListener(app, spec.server.host, port)
        try:
            yield
        finally:
            if listener is not None:
                await listener.stop()

    return lifespan

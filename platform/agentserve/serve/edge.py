"""The ingress app's edge: what answers before any route runs, outermost first.

UnauthenticatedLimit  a token bucket per client host for requests without credentials
                      (serve/health.py): 429
OpenModeGuard         open mode only: trusted Host names and JSON POSTs (serve/host_guard.py):
                      400/415
AdminGate             /metrics and /status off the public API port; with metrics_port set,
                      that port serves only them and /health (serve/admin.py, its lifespan)
error handlers        every error a route raises as an OpenAI JSON error (api/errors.py)
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from agentserve.api.errors import install_error_handlers
from agentserve.serve.admin import AdminGate, admin_lifespan
from agentserve.serve.health import UnauthenticatedLimit
from agentserve.serve.host_guard import OpenModeGuard, trusted_hosts
from agentserve.spec import DeploymentSpec

__all__ = ["edge_app"]


def edge_app(spec: DeploymentSpec, open_mode: bool, keys_required: Callable[[], bool]) -> FastAPI:
    """A FastAPI app with no routes yet, behind the edge above. `open_mode`: no tenants
    (then only trusted hosts and JSON POSTs); `keys_required()` is asked per request (the
    tenants may change)."""
    app = FastAPI(
        title="agentserve",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # the ingress serves it behind the API key
        lifespan=admin_lifespan(spec),
    )
    app.add_middleware(AdminGate, metrics_port=spec.server.metrics_port)
    app.add_middleware(OpenModeGuard, trusted=trusted_hosts(spec) if open_mode else None)
    app.add_middleware(UnauthenticatedLimit, keys_required=keys_required)
    install_error_handlers(app)
    return app

"""Ray Serve's status (applications, deployments, replica states) as plain JSON-able dicts.

`status_dict` is a pure conversion of `serve.status()`; `add_status_route` exposes it on
the ingress as GET /status, so `agentserve status` works against any running deployment
over HTTP, without joining its Ray cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["add_status_route", "current_status", "status_dict"]


def status_dict(status: Any) -> dict[str, Any]:
    """ServeStatus -> {"applications": {app: {"status", "message", "deployments": {name:
    {"status", "replicas": {state: count}, "message"}}}}, "proxies": {node_id: status}}."""
    apps = {
        name: {
            "status": _value(app.status),
            "message": app.message,
            "deployments": {
                dep_name: {
                    "status": _value(dep.status),
                    "replicas": {_value(k): int(v) for k, v in dep.replica_states.items()},
                    "message": dep.message,
                }
                for dep_name, dep in app.deployments.items()
            },
        }
        for name, app in status.applications.items()
    }
    return {"applications": apps, "proxies": {k: _value(v) for k, v in status.proxies.items()}}


def current_status() -> dict[str, Any]:
    """status_dict of this Ray cluster's Serve (blocking: a call to the Serve controller)."""
    from ray import serve

    return status_dict(serve.status())


def add_status_route(app: Any) -> None:
    """Add GET /status (Serve applications, deployments, replicas, and the machine the
    ingress runs on: CPU model, usable cores, vector features, cpu_class) to a FastAPI app."""
    from agentserve.engine.cpu_info import read_cpu_info

    machine = read_cpu_info().as_dict()

    @app.get("/status")
    async def serve_status() -> dict[str, Any]:
        return {**await asyncio.to_thread(current_status), "machine": machine}


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))

"""Ray Serve's status (applications, deployments, replica states) as plain JSON-able dicts.

`status_dict` is a pure conversion of `serve.status()`; `add_status_route` exposes it on
the ingress as GET /status, so `agentserve status` works against any running deployment
over HTTP, without joining its Ray cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentserve.serve.cached import ADMIN_TTL_S, Cached

__all__ = [
    "add_status_route",
    "current_status",
    "replica_states",
    "states_from_details",
    "status_dict",
]


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


def states_from_details(details: dict[str, Any], app: str, deployment: str) -> dict[str, int]:
    """{state: count} of one deployment's replicas in the controller's raw instance details
    (pure; KeyError when the application or deployment is unknown)."""
    counts: dict[str, int] = {}
    for replica in details["applications"][app]["deployments"][deployment].get("replicas", []):
        state = _value(replica.get("state"))
        counts[state] = counts.get(state, 0) + 1
    return counts


def replica_states(app: str, deployment: str) -> dict[str, int]:
    """{state: count} of one deployment's replicas (blocking: a call to the Serve controller).

    Reads the controller's instance details as the plain dict it sends: `serve.status()`
    validates that dict into pydantic models, and validating each deployment's
    request-router config cloudpickles the router class, which walks `sys.modules`; in a
    process that has imported vLLM and torch that cost tens of milliseconds of CPU per call
    (measured: 0.5 ms against 8.6 ms in a bare driver). Falls back to `serve.status()`
    where the client is not reachable."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client(raise_if_no_controller_running=False)
        if client is not None:
            return states_from_details(client.get_serve_details(), app, deployment)
    except (ImportError, AttributeError, TypeError):  # another Ray: the public call below
        pass
    status = current_status()
    return status["applications"][app]["deployments"][deployment]["replicas"]


def add_status_route(app: Any, ttl_s: float = ADMIN_TTL_S) -> Cached[dict[str, Any]]:
    """Add GET /status (Serve applications, deployments, replicas, and the machine the
    ingress runs on: CPU model, usable cores, vector features, cpu_class) to a FastAPI app.
    One answer per `ttl_s` for all callers (serve/cached.py): each costs a Serve
    controller call. Returns the cache."""
    from agentserve.engine.cpu_info import read_cpu_info

    machine = read_cpu_info().as_dict()

    async def compute() -> dict[str, Any]:
        return {**await asyncio.to_thread(current_status), "machine": machine}

    cache = Cached(compute, ttl_s)

    @app.get("/status")
    async def serve_status() -> dict[str, Any]:
        return await cache.get()

    return cache


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))

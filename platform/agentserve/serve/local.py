"""Run a DeploymentSpec on a fresh local Ray cluster: start, read readiness, stop.

The caller drives the loop (and prints); `readiness` and `describe_progress` are pure
functions of the dict `current_app_state` returns, so the CLI's decisions are testable.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Literal

from agentserve.engine import core_slots
from agentserve.ray_env import apply_ray_env
from agentserve.serve.replica import EngineFactory, default_engine_factory
from agentserve.serve.status import current_status
from agentserve.spec import DeploymentSpec

__all__ = [
    "APP_NAME",
    "Readiness",
    "admin_url",
    "base_url",
    "cpu_engine_replicas",
    "current_app_state",
    "describe_progress",
    "init_local_ray",
    "readiness",
    "start_local",
    "stop_local",
    "stop_log_monitor",
]

APP_NAME = "agentserve"
LOOPBACK = "127.0.0.1"
_QUIET_LOGGERS = ("ray", "ray.serve", "ray.data", "ray.train")


@dataclass(frozen=True)
class Readiness:
    """Where a deployment stands: starting, ready (every deployment HEALTHY) or failed."""

    phase: Literal["starting", "ready", "failed"]
    detail: str = ""


def base_url(spec: DeploymentSpec, port: int | None = None) -> str:
    """http://HOST:PORT a local client reaches the spec's server at (a wildcard bind is
    reached on loopback); `port` defaults to server.port."""
    host = spec.server.host
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port or spec.server.port}"


def admin_url(spec: DeploymentSpec) -> str:
    """Where /status and /metrics answer: server.metrics_port when set, else the API port
    (to loopback clients only; serve/admin.py)."""
    return base_url(spec, spec.server.metrics_port)


def ray_num_cpus(spec: DeploymentSpec, cpu_count: int | None = None) -> int:
    """CPUs to give the local Ray node: the machine's, or more if the initial replicas
    ask for more (a laptop oversubscribes rather than waiting forever for a core)."""
    wanted = sum(m.replicas.num_cpus * _initial_replicas(m.replicas) for m in spec.models)
    return max(cpu_count or os.cpu_count() or 1, math.ceil(wanted))


def cpu_engine_replicas(spec: DeploymentSpec) -> int:
    """vLLM engines on CPU the local node starts with (engine/core_slots.py splits the
    cores among them)."""
    return sum(
        _initial_replicas(m.replicas) for m in spec.models if m.engine == "vllm" and not m.on_gpu
    )


def _initial_replicas(replicas: Any) -> int:
    if replicas.initial_replicas is not None:
        return replicas.initial_replicas
    return max(1, replicas.min_replicas)


def quiet_ray_logging(level: int = logging.ERROR) -> None:
    """Keep Ray's and Serve's driver-side log lines below `level` off the terminal."""
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(level)


def pin_token_auth() -> None:
    """RAY_AUTH_MODE=token for this process and the Ray processes it starts, even over a
    stray RAY_AUTH_MODE=disabled (ray.init then makes or reads ~/.ray/auth_token).

    Ray's control plane (GCS, raylet, dashboard agent) runs code for whoever reaches it,
    and Ray 2.60's gRPC servers listen on every interface even with the node address on
    loopback (start_local sets it): the token is the guard. Ray caches the mode when it is
    imported, so setting the variable alone is not enough: Ray's own helper also refreshes
    its cached config (the same call its default-on path makes)."""
    from ray._private.authentication import authentication_token_setup as auth

    auth._enable_token_auth()


def stop_log_monitor() -> bool:
    """Stop the local cluster's log monitor; True when one was running.

    It exists to copy Ray's log lines to a driver started with log_to_driver, and rereads
    the log directory ten times a second to do it; a quiet `agentserve up` is not such a
    driver, and nothing else reads it (the logs stay in Ray's files): about 0.2 CPU-s per
    30 s idle on a 2-core EPYC, taken from the engine's OpenMP threads (`agentserve bench
    ray-idle`). ray.init has no option for it, so Ray's Node method is used (the call
    Ray's own tests make); a Ray without it keeps its monitor."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    if node is None or not hasattr(node, "kill_log_monitor"):
        return False
    try:
        node.kill_log_monitor(check_alive=False)
    except Exception as err:  # a private API: serving matters more than this saving
        logging.getLogger(__name__).warning("Ray's log monitor keeps running: %s", err)
        return False
    return True


def init_local_ray(num_cpus: int, verbose: bool = False) -> None:
    """A fresh local Ray cluster on loopback with token auth, Ray's environment for this
    machine (ray_env.py) and, unless `verbose`, no log lines copied to this process and no
    log monitor (AGENTSERVE_RAY_LOG_MONITOR=keep keeps it)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    apply_ray_env()  # Ray's processes: nice 0 and a quieter control loop where measured
    import ray

    pin_token_auth()
    level = logging.INFO if verbose else logging.ERROR
    quiet_ray_logging(level)
    ray.init(
        address="local",  # always a fresh cluster, never someone else's
        _node_ip_address=LOOPBACK,
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=verbose,
        logging_level=level,
    )
    if not verbose and os.environ.get("AGENTSERVE_RAY_LOG_MONITOR") != "keep":
        stop_log_monitor()
    quiet_ray_logging(level)


def start_local(
    spec: DeploymentSpec,
    *,
    engine_factory: EngineFactory = default_engine_factory,
    verbose: bool = False,
) -> None:
    """Start a new local Ray cluster and Serve, and submit the app without waiting for it.

    Raises whatever Ray raises when it cannot start. `verbose` streams replica logs (vLLM
    included) to this process's stderr/stdout; otherwise they stay in Ray's log files.
    """
    cpu_engines = cpu_engine_replicas(spec)
    if cpu_engines > 1:  # Ray's processes inherit it: each engine binds a slot of cores
        os.environ.setdefault(core_slots.REPLICAS_VARIABLE, str(cpu_engines))
    init_local_ray(ray_num_cpus(spec), verbose)
    from ray import serve

    server = spec.server
    serve.start(
        http_options={
            "host": server.host,
            "port": server.port,
            "request_timeout_s": server.request_timeout_s,
        },
        logging_config={"log_level": "INFO" if verbose else "WARNING"},
    )
    from agentserve.serve.app import build_app  # lazy: imports Ray, like the lines above

    # run_many (not run) because it can return before the replicas are up: the caller
    # polls current_app_state() and shows progress while engines start.
    target = serve.RunTarget(build_app(spec, engine_factory), name=APP_NAME, route_prefix="/")
    serve.run_many(
        [target], wait_for_ingress_deployment_creation=False, wait_for_applications_running=False
    )


def current_app_state() -> dict[str, Any] | None:
    """The app's entry of serve/status.status_dict, or None before the controller knows it."""
    return current_status()["applications"].get(APP_NAME)


def stop_local() -> None:
    """Shut down Serve, then the local Ray cluster; safe to call when either is down."""
    import ray
    from ray import serve

    if ray.is_initialized():
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def readiness(app: dict[str, Any] | None) -> Readiness:
    """Pure: "ready" when the app is RUNNING with every deployment HEALTHY; "failed" when
    it is DEPLOY_FAILED or UNHEALTHY (detail = the deployments' messages); else "starting"."""
    if app is None:
        return Readiness("starting", "submitting the application")
    deployments = app.get("deployments", {})
    if app["status"] in ("DEPLOY_FAILED", "UNHEALTHY"):
        messages = [
            f"{name}: {d['message']}"
            for name, d in deployments.items()
            if d["status"] != "HEALTHY" and d["message"]
        ]
        return Readiness("failed", "\n".join(messages) or app.get("message") or app["status"])
    if app["status"] == "RUNNING" and all(d["status"] == "HEALTHY" for d in deployments.values()):
        return Readiness("ready")
    return Readiness("starting", app["status"])


def describe_progress(app: dict[str, Any] | None, model_deployments: dict[str, str]) -> str:
    """Pure: one line saying what is starting, e.g. "model smollm2: replica STARTING".

    `model_deployments` maps deployment name -> model name (the others are shown by name).
    """
    if app is None:
        return "submitting the application to Ray Serve"
    waiting = []
    for name, dep in sorted(app.get("deployments", {}).items()):
        if dep["status"] == "HEALTHY":
            continue
        what = f"model {model_deployments[name]}" if name in model_deployments else name
        states = ", ".join(f"{n} {s}" for s, n in sorted(dep["replicas"].items())) or "pending"
        waiting.append(f"{what}: replicas {states}")
    return "; ".join(waiting) or "all deployments healthy; waiting for HTTP"

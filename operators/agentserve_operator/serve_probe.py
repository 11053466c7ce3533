"""Serve's own replica states of one AgentServe, for status: GET /status (agentserve.serve.
status: {state: count} per deployment) of an ingress replica of the *active* Ray cluster,
on its admin port (server.metrics_port) of the head pod.

KubeRay's RayService status has only each Serve deployment's status and message, not its
replicas' states; pod readiness is no substitute (a worker's Serve proxy, which makes the
pod Ready, starts with a replica still loading its weights: STARTING, not RUNNING).
Reached directly at the head pod's IP (the Ray pods' NetworkPolicy admits the admin ports
from pods of the cluster); any failure is None: status then falls back (status.py).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from agentserve_operator import resource as r

__all__ = ["TIMEOUT_S", "fetch_status", "status_url"]

TIMEOUT_S = 3.0  # one reconcile of one CR waits at most this long for it


def status_url(d: r.Desired, pods: list[dict[str, Any]], cluster: str | None) -> str | None:
    """http://<head pod IP>:<metrics_port>/status of the Ray cluster `cluster` (KubeRay's
    active one), or None: no active cluster, no running head pod with an IP yet."""
    if cluster is None:
        return None
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        status = pod.get("status") or {}
        if (labels.get("ray.io/cluster") == cluster and labels.get("ray.io/node-type") == "head"
                and status.get("phase") == "Running" and status.get("podIP")):  # fmt: skip
            return f"http://{status['podIP']}:{d.spec.server.metrics_port}/status"
    return None


def fetch_status(url: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any] | None:
    """The JSON body of GET `url`, or None on any failure (unreachable, refused, not JSON)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) else None

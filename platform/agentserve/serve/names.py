"""Names of the Serve deployments of one agentserve application, without a Ray import:
the serving app (serve/app.py), `agentserve up` and the operator's RayService manifest
(agentserve_operator/manifests.py) all take them from here, so they cannot disagree."""

from __future__ import annotations

import re

__all__ = ["INGRESS_NAME", "QUOTA_NAME", "deployment_name"]

INGRESS_NAME = "ingress"
"""The ingress deployment (server.ingress_replicas replicas; routes, admission, metrics)."""
QUOTA_NAME = "tenant-limits"
"""The tenant-limits keeper, with more than one ingress replica (admission/shared_limits.py)."""


def deployment_name(model: str) -> str:
    """Serve deployment name for a model id (slashes and colons are not allowed)."""
    return "model-" + re.sub(r"[^A-Za-z0-9._-]", "-", model)

"""RoutingSpec: how one model's requests are spread over its replicas (session and prefix
affinity with bounded imbalance: serve/affinity.py)."""

from __future__ import annotations

from pydantic import Field

from agentserve.spec.base import _Spec


class RoutingSpec(_Spec):
    """Replica choice for one model's requests."""

    affinity: bool = Field(
        True,
        description="Keep a conversation on one replica, where its prefix is in the KV "
        "cache: requests with the same x-session-id header (without one: the same leading "
        "prompt, the messages up to the first user message) go to the replica that served "
        "the last of them, unless its queue is max_imbalance_requests longer than the "
        "shortest or it is gone; then to the least-loaded replica. false: Ray Serve's "
        "power of two choices.",
    )
    max_imbalance_requests: int = Field(
        4,
        ge=0,
        le=10_000,
        description="Affinity yields when the preferred replica has more than this many "
        "requests (queued + running) over the least-loaded replica.",
    )
    affinity_prefix_chars: int = Field(
        2048,
        ge=16,
        le=1_000_000,
        description="Requests without x-session-id: characters of each leading message "
        "(of a completion prompt) that make the affinity key.",
    )

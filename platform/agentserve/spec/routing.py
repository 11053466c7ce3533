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
        "the last of them, unless its load is more than max_imbalance_requests over the "
        "least-loaded replica's or it is gone; a conversation's first request and those "
        "route as Ray Serve's default (power of two choices). false: always the default.",
    )
    max_imbalance_requests: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description="Affinity yields when the preferred replica has more than this many "
        "requests (queued + running) over the least-loaded replica. null: a sixteenth of a "
        "replica's batch slots (max_num_seqs): 1 for a CPU replica's 16 slots (the "
        "conversation stays while its replica is at most one request over the least "
        "loaded, so an uneven split evens out at the next turn), 16 for a GPU replica's 256.",
    )

    def imbalance_bound(self, engine_slots: int) -> int:
        """max_imbalance_requests, or the default for a replica of `engine_slots` slots."""
        if self.max_imbalance_requests is not None:
            return self.max_imbalance_requests
        return engine_slots // 16

    affinity_prefix_chars: int = Field(
        2048,
        ge=16,
        le=1_000_000,
        description="Requests without x-session-id: characters of each leading message "
        "(of a completion prompt) that make the affinity key.",
    )

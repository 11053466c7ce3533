"""AffinityRouter: Ray Serve's request router for a model deployment, with session and
prefix affinity (serve/affinity.py decides; this adapts it to Ray's router API).

Ray Serve runs one router per deployment handle (in the ingress process) and asks it to
rank the replicas for each pending request (`choose_replicas`); it then tries the ranks in
order, each replica only while its queue is under max_ongoing_requests, and backs off
and asks again when none accepts. A request with an affinity key (the engine request's
AFFINITY_HEADER, which the ingress sets) gets its key's home first, the others by load
next; calls without one (stats, health) and any failure to read the request route as
Serve's default, power of two choices. Queue lengths come from the router's cache (what
replicas last reported; unknown counts as 0, and Serve probes the chosen replica before
it sends). A dead replica's keys are forgotten: their next request goes to the least loaded.

`deployment_options` names this class by import path (serve/app.py, `router_config`), with
the model's spec.routing as its `initialize_state` arguments.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from agentserve.serve.affinity import AFFINITY_HEADER, KeyHomes, route

__all__ = ["ROUTER_PATH", "AffinityRouter", "request_affinity_key"]

ROUTER_PATH = "agentserve.serve.affinity_router.AffinityRouter"
log = logging.getLogger(__name__)


def request_affinity_key(pending: PendingRequest | None) -> str | None:
    """The affinity key a pending request carries (its first argument with `headers`, an
    EngineRequest), or None."""
    if pending is None:
        return None
    for arg in pending.args or ():
        headers = getattr(arg, "headers", None)
        if isinstance(headers, Mapping):
            key = headers.get(AFFINITY_HEADER)
            return key if isinstance(key, str) and key else None
    return None


class AffinityRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Session/prefix affinity with bounded imbalance (module docstring). Not FIFO: the
    replica chosen for a request is given to that request (FIFOMixin would hand it to the
    oldest pending one, whatever its key)."""

    def initialize_state(self, max_imbalance_requests: int = 4, max_keys: int = 100_000):
        """Ray calls this with RequestRouterConfig.request_router_kwargs."""
        self._max_imbalance = max_imbalance_requests
        self._homes = KeyHomes(max_keys)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        key = request_affinity_key(pending_request)
        if key is not None and candidate_replicas:
            try:
                return self._affinity_ranks(key, candidate_replicas, pending_request)
            except Exception:  # routing must never fail a request: fall back to Serve's
                log.warning("affinity routing failed; power of two choices", exc_info=True)
        return await PowerOfTwoChoicesRequestRouter.choose_replicas(
            self, candidate_replicas=candidate_replicas, pending_request=pending_request
        )

    def _affinity_ranks(
        self, key: str, replicas: list[RunningReplica], pending: PendingRequest | None
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.to_full_id_str(): r for r in replicas}
        cache = self.replica_queue_len_cache
        loads = {rid: cache.get(r.replica_id) for rid, r in by_id.items()}
        order = route(key, self._homes.get(key), loads, self._max_imbalance).order
        if pending is not None:  # tried every rank: back off before asking again
            pending.routing_context.should_backoff = True
        return [[by_id[order[0]]], [by_id[rid] for rid in order[1:]]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        key = request_affinity_key(pending_request)
        if key is not None:
            self._homes.set(key, replica_id.to_full_id_str())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._homes.forget_replica(replica_id.to_full_id_str())

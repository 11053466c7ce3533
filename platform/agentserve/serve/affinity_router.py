"""AffinityRouter: Ray Serve's request router for a model deployment, with session and
prefix affinity (serve/affinity.py decides; this adapts it to Ray's router API).

Ray Serve runs one router per deployment handle (in the ingress process) and asks it to
rank the replicas for each pending request (`choose_replicas`); it then tries the ranks in
order, each replica only while its queue is under max_ongoing_requests, and backs off
and asks again when none accepts. A request whose affinity key (the engine request's
AFFINITY_HEADER, which the ingress sets) has a home gets that replica first, the others
next, while the home is at most max_imbalance requests busier than the least-loaded
replica. Everything else routes exactly as Serve's default, power of two choices: calls
without a key (stats, health), a key's first request (nothing is cached anywhere yet, so
there is nothing to prefer), a key whose home is overloaded or gone, and any failure to
read the request. Loads are the larger of what the replica last reported (Serve's queue
length cache, whose entries expire after a few seconds) and the requests this router has
sent it that have not completed (`on_request_routed` / `on_request_completed`), so an
expired cache entry does not read as an idle replica, plus the requests sent home that
are not routed yet: Serve's routing tasks choose for several pending requests before the
first is routed, and without these a burst of one key (a fan-out, or prompts sharing their
opening) all went home and queued behind each other. Such a reservation ends when its
request is routed, chosen again, or after RESERVATION_S. A dead replica's keys are forgotten.

`deployment_options` names this class by import path (serve/app.py, `router_config`), with
the model's spec.routing as its `initialize_state` arguments.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
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
RESERVATION_S = 5.0  # a request chosen for its home and not routed in this long: not counted
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
        self._sent: dict[str, str] = {}  # internal request id -> replica id, until completed
        self._in_flight: Counter[str] = Counter()  # replica id -> requests sent, not completed
        self._reserved: dict[str, tuple[str, float]] = {}  # request id -> (home, when chosen)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        key = request_affinity_key(pending_request)
        home = self._homes.get(key) if key is not None else None
        if home is not None and candidate_replicas:
            try:
                ranks = self._home_ranks(key, home, candidate_replicas, pending_request)
            except Exception:  # routing must never fail a request: fall back to Serve's
                log.warning("affinity routing failed; power of two choices", exc_info=True)
                ranks = None
            if ranks is not None:
                return ranks
        return await PowerOfTwoChoicesRequestRouter.choose_replicas(
            self, candidate_replicas=candidate_replicas, pending_request=pending_request
        )

    def replica_load(self, replica: RunningReplica) -> int:
        """Queued + running requests of `replica` as this router knows them (module
        docstring)."""
        rid = replica.replica_id.to_full_id_str()
        cached = self.replica_queue_len_cache.get(replica.replica_id)
        return max(cached or 0, self._in_flight[rid]) + self._reservations(rid)

    def _reservations(self, rid: str) -> int:
        """Requests chosen for `rid` as their home and not routed yet (expired ones dropped)."""
        stale = time.monotonic() - RESERVATION_S
        for request_id in [r for r, (_, at) in self._reserved.items() if at < stale]:
            del self._reserved[request_id]
        return sum(1 for home, _ in self._reserved.values() if home == rid)

    def _home_ranks(
        self, key: str, home: str, replicas: list[RunningReplica], pending: PendingRequest | None
    ) -> list[list[RunningReplica]] | None:
        """[[home], [the others]] while the home holds the key, else None (Serve's default)."""
        by_id = {r.replica_id.to_full_id_str(): r for r in replicas}
        request_id = pending.metadata.internal_request_id if pending is not None else None
        self._reserved.pop(request_id, None)  # chosen again: its last choice no longer counts
        loads = {rid: self.replica_load(r) for rid, r in by_id.items()}
        decision = route(key, home, loads, self._max_imbalance)
        if decision.reason != "home":
            return None
        if pending is not None:  # tried every rank: back off before asking again
            pending.routing_context.should_backoff = True
            self._reserved[request_id] = (home, time.monotonic())
        return [[by_id[home]], [by_id[rid] for rid in decision.order[1:]]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        rid = replica_id.to_full_id_str()
        key = request_affinity_key(pending_request)
        if key is not None:
            self._homes.set(key, rid)
        request_id = pending_request.metadata.internal_request_id
        self._reserved.pop(request_id, None)  # counted from here on as sent
        if request_id not in self._sent:
            self._sent[request_id] = rid
            self._in_flight[rid] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        rid = self._sent.pop(internal_request_id, None)
        if rid is not None:
            self._in_flight[rid] -= 1
            if self._in_flight[rid] <= 0:
                del self._in_flight[rid]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        rid = replica_id.to_full_id_str()
        self._homes.forget_replica(rid)
        self._in_flight.pop(rid, None)
        for request_id in [r for r, where in self._sent.items() if where == rid]:
            del self._sent[request_id]

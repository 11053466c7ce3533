"""Poison requests: a request whose replicas died under it twice is not replayed again.

serve/migrate.py continues a request on another replica when its replica dies. A request
that itself crashes the engine (a vLLM bug some input triggers) would then kill every
replica it is replayed on. So the second death ends it with PoisonRequestError (a 400,
code `request_crashed_engine`), and the ingress remembers its fingerprint (PoisonList)
for a while.

Deaths are counted per request, not per choice (`Deaths`, shared by all choices of an
n > 1 or batched request) and per replica: choices on the same dying replica count it
once (EngineDeadError.replica; a death with no replica id counts on its own). So a
16-choice poison batch kills at most one wave of replicas, not two per choice.

Quarantine is keyed by tenant and request (the fingerprint hashes both). A request marked
poison whose dead replicas also took down another request (another fingerprint died on
every one of them) may be a victim, not the cause: it is sent again when retried, but on
probation (one death ends it and confirms it). A request that alone died on all its
dead replicas is refused at once for REMEMBER_S, as is one that failed its probation.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from agentserve.engine.protocol import EngineRequestError

__all__ = ["POISON_DEATHS", "Deaths", "PoisonList", "PoisonRequestError", "fingerprint"]

POISON_DEATHS = 2  # replica deaths under one request that mark it as poison
REMEMBER_S = 600.0  # how long a poison fingerprint is refused
MAX_REMEMBERED = 1024  # poison fingerprints, and dead replicas indexed
MAX_PER_REPLICA = 4096  # fingerprints remembered per dead replica
PROBATION_DEATHS = 1  # death budget of a retried request that may have been a victim
# fields that differ between two sends of the same request (or that the ingress sets)
_VOLATILE = {"stream", "stream_options", "cache_salt", "request_id"}


class PoisonRequestError(EngineRequestError):
    """The request was being served by POISON_DEATHS replicas that each died."""

    def __init__(self, deaths: int = POISON_DEATHS, remembered: bool = False):
        if remembered:
            message = (
                "this request crashed model replicas earlier and is refused for a while; "
                "change it (or report it to the operator) instead of retrying"
            )
        else:
            message = (
                f"the {deaths} model replicas serving this request died; it is not "
                "replayed again because it may be what crashes them; a retry is served "
                "only if other requests died with it, and is refused for a while if it "
                "crashes a replica again"
            )
        super().__init__(message, status=400, code="request_crashed_engine")


def fingerprint(tenant: str, kind: str, body: Any) -> str:
    """A stable digest of what the engine would be asked (tenant, endpoint, body)."""
    dump = body.model_dump_json(exclude=_VOLATILE)
    return hashlib.sha256(f"{tenant}\0{kind}\0{dump}".encode("utf-8", "surrogatepass")).hexdigest()


class Deaths:
    """The replicas that died under one request, all its choices together; `add` the
    death seen by any choice, `count` distinct replicas. `on_death(replica)` (PoisonList's
    index) is told of each new one."""

    def __init__(self, on_death: Callable[[Hashable], None] | None = None):
        self.replicas: set[Hashable] = set()
        self._on_death = on_death

    def add(self, err: BaseException) -> int:
        """Count the replica `err` (an EngineDeadError) names; the distinct replicas so far."""
        replica = getattr(err, "replica", None) or object()  # unknown: a death of its own
        if replica not in self.replicas:
            self.replicas.add(replica)
            if self._on_death is not None:
                self._on_death(replica)
        return len(self.replicas)


class PoisonList:
    """Fingerprints of poison requests, forgotten after `remember_s` (bounded, oldest
    first), and which requests died on which replicas (to tell a cause from its victims)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        remember_s: float = REMEMBER_S,
        max_size: int = MAX_REMEMBERED,
    ):
        self._clock, self._remember_s, self._max = clock, remember_s, max_size
        # fingerprint -> (when, the replicas that died under it, confirmed)
        self._seen: OrderedDict[str, tuple[float, frozenset[Hashable], bool]] = OrderedDict()
        self._died: OrderedDict[Hashable, set[str]] = OrderedDict()  # replica -> fingerprints

    def deaths(self, tenant: str, kind: str, body: Any) -> Deaths:
        """A request's death counter, feeding the index of who died where."""
        key: list[str] = []

        def died(replica: Hashable) -> None:
            if not key:
                key.append(fingerprint(tenant, kind, body))
            on = self._died.pop(replica, set())  # moved to the end: the latest death
            self._died[replica] = on
            on.add(key[0])
            while len(on) > MAX_PER_REPLICA:
                on.pop()
            while len(self._died) > self._max:
                self._died.popitem(last=False)

        return Deaths(died)

    def add(
        self, tenant: str, kind: str, body: Any, deaths: Deaths | None = None, *,
        confirmed: bool = False,
    ) -> None:  # fmt: skip
        """Mark this request (serve/migrate.py's `on_poison`); `deaths`: the replicas that
        died under it; `confirmed`: it failed its probation."""
        key = fingerprint(tenant, kind, body)
        replicas = frozenset(deaths.replicas) if deaths is not None else frozenset()
        self._seen.pop(key, None)
        self._seen[key] = (self._clock(), replicas, confirmed)
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)

    def check(self, tenant: str, kind: str, body: Any) -> int:
        """The request's death budget: POISON_DEATHS, or PROBATION_DEATHS for a marked
        request that others died with; PoisonRequestError when it was marked within
        `remember_s` and died alone (nothing to hash while none is marked)."""
        if not self._seen:
            return POISON_DEATHS
        key = fingerprint(tenant, kind, body)
        seen = self._seen.get(key)
        if seen is None:
            return POISON_DEATHS
        at, replicas, confirmed = seen
        if self._clock() - at > self._remember_s:
            del self._seen[key]
            return POISON_DEATHS
        if not confirmed and self._shared(key, replicas):
            return PROBATION_DEATHS
        raise PoisonRequestError(remembered=True)

    def _shared(self, key: str, replicas: frozenset[Hashable]) -> bool:
        """Whether another request died on every replica that died under `key`."""
        others: set[str] | None = None
        for replica in replicas:
            on = self._died.get(replica, set()) - {key}
            others = on if others is None else others & on
            if not others:
                return False
        return bool(others)

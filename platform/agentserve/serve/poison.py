"""Poison requests: a request whose replicas died under it twice is not replayed again.

serve/migrate.py continues a request on another replica when its replica dies. A request
that itself crashes the engine (a vLLM bug some input triggers) would then kill every
replica it is replayed on. So the second death ends it with PoisonRequestError (a 400,
code `request_crashed_engine`: a client should not retry it as it would a 5xx), and the
ingress remembers its fingerprint (PoisonList) for a while: the same request sent again
by the same tenant is refused at once instead of killing two more replicas.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from agentserve.engine.protocol import EngineRequestError

__all__ = ["POISON_DEATHS", "PoisonList", "PoisonRequestError", "fingerprint"]

POISON_DEATHS = 2  # replica deaths under one request that mark it as poison
REMEMBER_S = 600.0  # how long a poison fingerprint is refused
MAX_REMEMBERED = 1024
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
                f"the {deaths} model replicas serving this request each died; it is not "
                "replayed again because it may be what crashes them; change it (or report "
                "it to the operator) instead of retrying"
            )
        super().__init__(message, status=400, code="request_crashed_engine")


def fingerprint(tenant: str, kind: str, body: Any) -> str:
    """A stable digest of what the engine would be asked (tenant, endpoint, body)."""
    dump = body.model_dump_json(exclude=_VOLATILE)
    return hashlib.sha256(f"{tenant}\0{kind}\0{dump}".encode("utf-8", "surrogatepass")).hexdigest()


class PoisonList:
    """Fingerprints of poison requests, forgotten after `remember_s` (bounded, oldest first)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        remember_s: float = REMEMBER_S,
        max_size: int = MAX_REMEMBERED,
    ):
        self._clock, self._remember_s, self._max = clock, remember_s, max_size
        self._seen: OrderedDict[str, float] = OrderedDict()  # fingerprint -> when

    def add(self, tenant: str, kind: str, body: Any) -> None:
        """Mark this request (serve/migrate.py's `on_poison`)."""
        key = fingerprint(tenant, kind, body)
        self._seen.pop(key, None)
        self._seen[key] = self._clock()
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)

    def check(self, tenant: str, kind: str, body: Any) -> None:
        """PoisonRequestError when this request was marked within `remember_s` (nothing
        to hash while none is marked)."""
        if not self._seen:
            return
        key = fingerprint(tenant, kind, body)
        at = self._seen.get(key)
        if at is None:
            return
        if self._clock() - at > self._remember_s:
            del self._seen[key]
            return
        raise PoisonRequestError(remembered=True)

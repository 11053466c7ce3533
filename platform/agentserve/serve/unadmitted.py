"""Requests not yet admitted, per tenant: between authentication and admission a request
holds an ingress slot (Ray Serve's proxy counts it against the ingress's
max_ongoing_requests) while nothing is charged to its tenant yet. A tenant may have at most
server.max_unadmitted_per_tenant such requests (body being read or checked) per ingress
replica; the next gets 429 `too_many_unadmitted_requests` before its body is read, so one
tenant's many slow connections cannot occupy the ingress for the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from agentserve.api.errors import RateLimitError

__all__ = ["UNADMITTED_CODE", "Unadmitted"]

UNADMITTED_CODE = "too_many_unadmitted_requests"


class Unadmitted:
    """Per-tenant counts of requests between authentication and admission; `limit` None:
    uncounted (open mode, where every client is the one tenant)."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.counts: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        """One place of `tenant`'s for the block; RateLimitError (429) when it has `limit`
        already. The place is given back however the block ends."""
        if self.limit is None:
            yield
            return
        held = self.counts.get(tenant, 0)
        if held >= self.limit:
            raise RateLimitError(
                f"Tenant {tenant!r} already has {held} requests whose bodies are being sent "
                f"or checked (server.max_unadmitted_per_tenant = {self.limit}); send the "
                "whole body at once, or retry after one is answered.",
                code=UNADMITTED_CODE,
            )
        self.counts[tenant] = held + 1
        try:
            yield
        finally:
            left = self.counts[tenant] - 1
            if left:
                self.counts[tenant] = left
            else:
                del self.counts[tenant]

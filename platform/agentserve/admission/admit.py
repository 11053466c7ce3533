"""3. parse and 4. admit: the ingress stage that validates a body and takes its places in
the model's queue and the tenant's limits, with the undo that gives them back. Ray-free;
nothing here imports the request path (serve/): the ingress hands in its metrics and the
request's holder (serve/stages.py Held), typed here by what admission uses of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agentserve.admission.adapter_names import ModelNames
from agentserve.admission.admit_first import parse_and_admit
from agentserve.admission.parsing import RequestParser
from agentserve.admission.shared_limits import LocalQuota, SharedQuota
from agentserve.admission.shares import AdmittedCall, QueueShares
from agentserve.api.ask import Ask
from agentserve.api.auth import Tenant
from agentserve.api.embeddings import generate_only
from agentserve.api.responses import ResponsesRequest
from agentserve.engine.protocol import Delta, RequestKind
from agentserve.spec import DeploymentSpec

__all__ = ["Admit", "Holder", "QueueGauges", "Quota"]

Quota = LocalQuota | SharedQuota  # admission/shared_limits.py


class QueueGauges(Protocol):
    """The per-model gauges admission counts on (serve/metrics.py ServingMetrics):
    `in_flight` and `queued`, each `.labels(model).inc()` / `.dec()`."""

    in_flight: Any
    queued: Any


class Holder(Protocol):
    """What one request holds (serve/stages.py Held): its admitted call, and the stack its
    stages push their undos on."""

    call: AdmittedCall | None
    undo: contextlib.AsyncExitStack


class Admit:
    """3. parse and 4. admit. Parse off the event loop (admission/parsing.py), in the order
    admission/admit_first.py picks; admit into the model's queue (admission/shares.py: 404,
    503 full, 429 past the tenant's fair share) and the tenant's limits (admission/quota.py,
    reserving tokens: 429)."""

    def __init__(
        self,
        spec: DeploymentSpec,
        models: Mapping[str, int],  # served model -> its capacity
        metrics: QueueGauges,
        clock: Callable[[], float],
        quota: Quota | None = None,
    ):
        self.max_model_len = {m.name: m.max_model_len for m in spec.models}
        self.embedders = frozenset(m.name for m in spec.models if m.task == "embed")
        self.parser = RequestParser(self.max_model_len)
        self.names = ModelNames(spec.models)  # adapters: admission/adapter_names.py
        self.shares = QueueShares(models, spec.server.max_queue_len)
        self.quota = quota or LocalQuota(clock)
        self.metrics, self.clock = metrics, clock

    async def __call__(
        self,
        kind: RequestKind,
        raw: bytes,
        tenant: Tenant,
        responses: ResponsesRequest | None,
        held: Holder,
    ) -> Ask:
        """The validated request's Ask (api/ask.py); its admission is on `held` as soon as
        it is taken, so a body admitted before its check and then refused is given back by
        the close."""
        adapter: list[str | None] = [None]  # what `translate` read from the model

        def translate(data: Any) -> Any:
            data = responses.translate(data) if responses is not None else data
            data, adapter[0] = self.names.rewrite(data)  # model:adapter -> model (404)
            return data

        async def admit(model: str, tenant: Tenant, reserve: int, count: int) -> AdmittedCall:
            generate_only(model, self.embedders)  # 400 for an embedding model
            call = await self.take(held, model, tenant, reserve, count)
            call.adapter = adapter[0]
            return call

        return await parse_and_admit(self.parser, admit, kind, raw, translate, tenant)

    async def take(
        self, held: Holder, model: str, tenant: Tenant, reserve_tokens: int = 0, count: int = 1
    ) -> AdmittedCall:
        """`admit`, the call on `held` with its undo on the stack."""
        held.call = await self.admit(model, tenant, reserve_tokens, count)
        held.undo.callback(self.undo, held.call)
        return held.call

    async def admit(
        self, model: str, tenant: Tenant, reserve_tokens: int = 0, count: int = 1
    ) -> AdmittedCall:
        """Take `count` places (its choices) in the model's queue and one in the tenant's
        limits, reserving `reserve_tokens`."""
        self.shares.admit(model, tenant, count)
        try:
            lease = await self.quota.admit(tenant, reserve_tokens, count)  # n counts n
        except BaseException:
            self.shares.release(model, tenant.name, count)
            raise
        self.metrics.in_flight.labels(model).inc()
        self.metrics.queued.labels(model).inc()
        return AdmittedCall(model, tenant.name, self.clock(), lease, count=count)

    def see(self, call: AdmittedCall, delta: Delta) -> None:
        """Count `delta` on `call`; its first output ends its time as queued."""
        if call.see(delta, self.clock()):
            self.metrics.queued.labels(call.model).dec()

    def undo(self, call: AdmittedCall) -> None:
        """Give back what `call` took: its queue places, its gauges, its tenant lease."""
        if call.first is None:
            self.metrics.queued.labels(call.model).dec()
        self.shares.release(call.model, call.tenant, call.count)
        self.metrics.in_flight.labels(call.model).dec()
        call.lease.finish(call.prompt_tokens + call.completion_tokens)

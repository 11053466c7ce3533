"""The stages of the ingress's request path that take something a request must give back,
each with one job and one undo; serve/ingress.py composes them, in this order:

  Held      what one request holds (span, admission, engine stream, status) and, in one
            AsyncExitStack, the undo of each stage taken; the close stage runs it, once
  Admit     3. parse and 4. admit: the body validated, places taken in the model's queue
            and the tenant's limits (admission/admit.py); undo: give them back
  Dispatch  5. dispatch: poison and buffer checks, the engine request, a slot toward the
            replicas (earliest deadline first), the engine stream opened (migrating, n
            choices merged, capped) and its first delta; undo: close the stream, free the
            slots
  Close     7. close: the undos in reverse order, then metrics and the ingress span (the
            first thing on the stack, so the last to run)

Authenticate (api/auth.py) and read (api/body.py) take nothing; 6. stream is
serve/reply.py. Ray-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request
from opentelemetry.trace import Span, Tracer

from agentserve.admission.admit import Admit, Quota
from agentserve.admission.priority import Dispatcher
from agentserve.admission.response_budget import buffer_cap, capped
from agentserve.admission.shares import AdmittedCall, ingress_replicas
from agentserve.api.ask import Ask
from agentserve.api.auth import Tenant
from agentserve.api.cache_salt import CacheSalter, salt_key
from agentserve.api.errors import APIError, OverloadedError
from agentserve.api.responses import ResponsesRequest
from agentserve.engine.protocol import (
    Delta,
    EngineRequest,
    EngineRequestError,
    EngineUnavailableError,
    aclose_stream,
)
from agentserve.serve import spans
from agentserve.serve.affinity import AFFINITY_HEADER, affinity_key, affinity_prefix_chars
from agentserve.serve.backend import ModelBackend
from agentserve.serve.engine_request import engine_headers, engine_request
from agentserve.serve.fanout import fan_out
from agentserve.serve.held_board import HeldBoard, HeldStore, sla_scaled_models
from agentserve.serve.metrics import ServingMetrics
from agentserve.serve.migrate import migrating
from agentserve.serve.poison import POISON_DEATHS, PoisonList
from agentserve.spec import DeploymentSpec

__all__ = ["CLIENT_CLOSED", "Backends", "Close", "Dispatch", "Held", "held_for_cold_start"]
__all__ += ["request_stages", "status_of"]

T = TypeVar("T")

CLIENT_CLOSED = 499  # nginx's status for "client closed the request"
COLD_START_RETRY_AFTER_S = 10.0
Backends = Mapping[str, ModelBackend]  # model name -> its backend (serve/backend.py)


def status_of(err: BaseException) -> int:
    """The HTTP status a request that ended with `err` is recorded with."""
    if isinstance(err, (asyncio.CancelledError, GeneratorExit)):  # the client went away
        return CLIENT_CLOSED
    if isinstance(err, (APIError, EngineRequestError)):
        return err.status
    return 503 if isinstance(err, EngineUnavailableError) else 500


@dataclass
class Held:
    """What one request holds on the path; `status` is set once, by whoever decides it.
    `undo`: each stage pushes the undo of what it took as it takes it; the close stage
    runs them in reverse order, once (AsyncExitStack.aclose empties the stack)."""

    span: Span
    call: AdmittedCall | None = None  # admission/admit.py Admit: places in the queue, a lease
    stream: AsyncIterator[Delta] | None = None  # Dispatch: the engine stream
    status: int | None = None
    undo: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @classmethod
    def start(cls, tracer: Tracer, kind: str, headers: Mapping[str, str], close: Close) -> Held:
        """The ingress span, a child of the caller's valid traceparent (serve/spans.py);
        the close stage's record of the request first on the stack, so it runs last."""
        held = cls(spans.start_ingress(tracer, kind, headers))
        held.undo.callback(close.record, held)
        return held

    def finish(self, status: int) -> None:
        """The request's outcome; the first one set stands."""
        if self.status is None:
            self.status = status

    def fail(self, err: BaseException, responses: ResponsesRequest | None) -> None:
        """The request ended with `err`: its status, and for /v1/responses the Responses
        names of the parameters in the error (api/responses.py)."""
        self.finish(status_of(err))
        if responses is not None and isinstance(err, (APIError, EngineRequestError)):
            responses.rename(err)


def request_stages(
    spec: DeploymentSpec,
    backends: Backends,
    capacity: Mapping[str, int],
    metrics: ServingMetrics,
    clock: Callable[[], float],
    quota: Quota | None = None,
    board: tuple[HeldStore, str] | None = None,
) -> tuple[Admit, Dispatch, Close]:
    """The admit, dispatch and close stages of one ingress, wired to each other (the
    dispatch and close stages count on the admit stage's queue and metrics)."""
    admit = Admit(spec, capacity, metrics, clock, quota)
    return admit, Dispatch(spec, backends, admit, clock, board), Close(admit)


class Dispatch:
    """5. dispatch: from an admitted request to its first delta."""

    def __init__(
        self,
        spec: DeploymentSpec,
        backends: Backends,
        admit: Admit,
        clock: Callable[[], float],
        board: tuple[HeldStore, str] | None = None,
    ):
        """`board`: (store, scope) where this ingress publishes the requests it holds for
        the autoscaler (serve/held_board.py); None: it publishes nothing."""
        self.spec, self.backends, self.admit = spec, backends, admit
        self.board: HeldBoard | None = None
        if board is not None:
            self.board = HeldBoard(
                *board, uuid.uuid4().hex, lambda: self.dispatcher.held(), sla_scaled_models(spec)
            )
        on_wait = self.board.wake if self.board else lambda: None
        self.dispatcher = Dispatcher(spec.models, list(backends), ingress_replicas(spec), on_wait)
        self.salter = CacheSalter(salt_key())  # shared by all ingress replicas
        self.affinity = affinity_prefix_chars(spec)  # models routed by affinity
        self.poison = PoisonList(clock)  # requests that crashed replicas (serve/poison.py)

    async def __call__(
        self, ask: Ask, request: Request, tenant: Tenant, held: Held
    ) -> tuple[str, Delta]:
        """(engine request id, first delta): 400 for a request that crashed replicas or
        whose answer is too large to buffer, 429 for a batch request past its deadline,
        the engine's 4xx, 503 when it is unavailable or a cold start takes too long."""
        call, model, kind, body = held.call, ask.model, ask.kind, ask.payload
        budget = self.poison.check(tenant.name, kind, body)  # death budget, or 400
        cap = buffer_cap(ask, self.admit.max_model_len.get(model))  # None: a stream
        engine_request = self._engine_request(ask, request, tenant, held)
        spans.name_request(held.span, engine_request.request_id, call.adapter or model, ask)
        ready = await self.backends[model].ready_replicas()
        await self.send(held, model, tenant, ready)  # earliest deadline first
        held.stream = capped(self._open(ask, tenant, engine_request, budget), cap)
        held.undo.push_async_callback(aclose_stream, held.stream)  # the engine aborts the rest
        first = await self._first_or_hold(model, held.stream, ready)
        self.admit.see(call, first)
        return engine_request.request_id, first

    def _engine_request(
        self, ask: Ask, request: Request, tenant: Tenant, held: Held
    ) -> EngineRequest:
        """The payload (left as parsed) with this ingress's decisions
        (serve/engine_request.py)."""
        headers = engine_headers(held.span, request.headers, tenant.name)
        adapter = held.call.adapter if held.call is not None else None
        if (chars := self.affinity.get(ask.model)) is not None:  # serve/affinity.py
            served = f"{ask.model}:{adapter}" if adapter else ask.model  # one home each
            key = affinity_key(tenant.name, served, request.headers, ask, chars)
            headers.update({AFFINITY_HEADER: key} if key else {})
        priority = self.dispatcher.priority(ask.model, tenant)  # admission/priority.py
        salt = self.salter.salt(tenant.name, ask.cache_salt)  # no shared prefixes
        return engine_request(
            ask.kind, ask.payload, request_id=uuid.uuid4().hex, headers=headers, priority=priority,
            cache_salt=salt, adapter=adapter,
        )  # fmt: skip

    def _open(
        self, ask: Ask, tenant: Tenant, request: EngineRequest, budget: int
    ) -> AsyncIterator[Delta]:
        """The engine stream: one engine request per choice (n > 1: merged), each
        continued on another replica when its replica dies (serve/migrate.py); the
        choices share one count of replica deaths, `budget` of them make it poison."""
        model, kind, body = ask.model, ask.kind, ask.payload
        deaths = self.poison.deaths(tenant.name, kind, body)
        probation = budget < POISON_DEATHS

        def poisoned() -> None:
            self.poison.add(tenant.name, kind, body, deaths, confirmed=probation)

        return fan_out(
            request,
            lambda r: migrating(
                self.backends[model].generate,
                r,
                self.spec.server.max_migrations,
                on_migrate=lambda _: self.admit.metrics.migrations.labels(model).inc(),
                poison_deaths=budget,
                on_poison=poisoned,
                deaths=deaths,
            ),
        )

    async def _first_or_hold(
        self, model: str, stream: AsyncIterator[Delta], ready: int | None
    ) -> Delta:
        """The first delta. While the model has no ready replica (scaled to zero or
        starting), the request is held (it waits in Serve's router, which is also what
        triggers the scale-up) for at most cold_start_hold_timeout_s, then refused with
        503 and Retry-After. `ready`: the model's ready replicas (None = unknown)."""
        cold = ready is not None and ready <= 0
        hold_s = self.spec.autoscaling.cold_start_hold_timeout_s if cold else None
        return await held_for_cold_start(_first_delta(stream), model, hold_s)

    async def send(self, held: Held, model: str, tenant: Tenant, ready: int | None) -> None:
        """Slots toward the model's replicas for the admitted call's choices (earliest
        deadline first: admission/priority.py), their release on `held`'s stack."""
        count = held.call.count
        await self.dispatcher.send(model, tenant, count, ready)
        held.undo.callback(self.dispatcher.release, model, count)


async def _first_delta(stream: AsyncIterator[Delta]) -> Delta:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        raise EngineUnavailableError("the engine ended the request without output") from None


class Close:
    """7. close: give back what `held` holds, in reverse order (Dispatch, then Admit), and
    record the request once: metrics (serve/metrics.py) and the ingress span."""

    def __init__(self, admit: Admit):
        self.admit = admit

    async def __call__(self, held: Held) -> None:
        """Run `held`'s undo stack; a second close finds it empty."""
        await held.undo.aclose()

    def record(self, held: Held) -> None:
        """The request's metrics and ingress span, after every undo (Held.start)."""
        status, call = held.status or 500, held.call
        if call is None:  # refused before admission
            spans.end_ingress(held.span, status)
            return
        self.admit.metrics.observe_request(
            call.model,
            call.tenant,
            ttft_s=call.ttft(call.start),
            decode_s=call.decode_time(),
            prompt_tokens=call.prompt_tokens,
            output_tokens=call.completion_tokens,
            status=status,
            adapter=call.adapter,
        )
        spans.end_ingress(
            held.span,
            status,
            model=call.model,
            adapter=call.adapter,
            tenant=call.tenant,
            ttft_s=call.ttft(call.start),
            prompt_tokens=call.prompt_tokens,
            output_tokens=call.completion_tokens,
            finish_reasons=[r for _, r in sorted(call.finish_reasons.items())],
        )


async def held_for_cold_start(answer: Awaitable[T], model: str, hold_s: float | None) -> T:
    """`answer`, waited for at most hold_s (None: no limit) while the model has no ready
    replica (scaled to zero or starting); past it 503 with Retry-After."""
    if hold_s is None:
        return await answer
    try:
        return await asyncio.wait_for(answer, hold_s)
    except TimeoutError:
        raise OverloadedError(
            f"model {model!r} is starting (no ready replica) and did not answer within "
            f"{hold_s:g} s; retry later",
            retry_after_s=COLD_START_RETRY_AFTER_S,
        ) from None

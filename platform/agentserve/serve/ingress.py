"""The OpenAI-compatible ingress as a plain FastAPI app: auth -> tenant, quotas, admission,
trace and session headers, streaming, metrics. Ray-free; serve/app.py hosts it in Ray Serve.

Request path: in open mode, trusted Host and JSON POSTs only (400/415, serve/host_guard.py)
-> resolve tenant (401) -> parse body (400) -> find model (404) -> admit
(admission/shares.py: 503 model queue full, 429 past the tenant's fair share of it or its
limits, tokens reserved; a body with schemas or over 64 KiB is admitted before its full
check, admission/admit_first.py) -> wait for a slot toward the replicas, earliest deadline first,
priority set by tenant class (admission/priority.py: 429 for a batch request past its
deadline) -> backend.generate (through serve/migrate.py: a
request whose replica dies continues on another) -> first delta (engine 4xx
surface here as JSON errors; with no ready replica it is awaited at most
cold_start_hold_timeout_s, then 503 + Retry-After) -> JSON or SSE. Every exit records
metrics once. /v1/responses is a chat completion on this path (api/responses.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.trace import NoOpTracer, Span, Tracer

from agentserve.admission.admit_first import parse_and_admit
from agentserve.admission.priority import Dispatcher
from agentserve.admission.response_budget import buffer_cap, capped
from agentserve.admission.shared_limits import LocalQuota, SharedQuota
from agentserve.admission.shares import (
    AdmittedCall,
    QueueShares,
    ingress_replicas,
)
from agentserve.api.auth import Tenant, TenantResolver
from agentserve.api.body import read_body
from agentserve.api.cache_salt import CacheSalter, salt_key
from agentserve.api.errors import APIError, OverloadedError, error_body, install_error_handlers
from agentserve.api.openai import ResponseBuilder
from agentserve.api.responses import ResponsesRequest
from agentserve.api.responses_render import ResponsesBuilder
from agentserve.api.sse import ChatFrames
from agentserve.engine.protocol import (
    Delta,
    EngineError,
    EngineRequest,
    EngineRequestError,
    EngineUnavailableError,
    RequestKind,
)
from agentserve.serve import spans
from agentserve.serve.admin import AdminGate, admin_lifespan
from agentserve.serve.backend import ModelBackend
from agentserve.serve.engine_request import engine_headers, engine_request
from agentserve.serve.fanout import fan_out
from agentserve.serve.health import HealthCache, UnauthenticatedLimit
from agentserve.serve.host_guard import OpenModeGuard, trusted_hosts
from agentserve.serve.metrics import CONTENT_TYPE, ServingMetrics, model_limits, sla_objectives
from agentserve.serve.migrate import migrating
from agentserve.serve.parsing import RequestParser
from agentserve.serve.poison import PoisonList
from agentserve.spec import DeploymentSpec, TenantSpec

__all__ = ["SESSION_HEADER", "create_app"]

log = logging.getLogger(__name__)
SESSION_HEADER = spans.SESSION_HEADER
STATS_TIMEOUT_S = 2.0
CLIENT_CLOSED = 499  # nginx's status for "client closed the request"
COLD_START_RETRY_AFTER_S = 10.0


class _Ingress:
    """Holds the injected parts; its methods are the route bodies."""

    def __init__(
        self,
        spec: DeploymentSpec,
        backends: Mapping[str, ModelBackend],
        clock: Callable[[], float],
        tracer: Tracer,
        tenants: Sequence[TenantSpec] | None = None,
        quota: LocalQuota | SharedQuota | None = None,
    ):
        self.spec, self.backends, self.clock = spec, dict(backends), clock
        self.tracer = tracer
        self.tenants = TenantResolver(spec, tenants)
        self.quota = quota or LocalQuota(clock)  # admission/shared_limits.py
        limits = model_limits(spec)
        self.metrics = ServingMetrics(sla_objectives(spec, tenants), limits)
        queue = spec.server.max_queue_len
        capacity = {n: limits[n].capacity if n in limits else queue for n in self.backends}
        self.shares = QueueShares(capacity, queue)  # admission/shares.py
        self.shares.set_tenants(self.tenants.tenants())
        self.in_flight = self.shares.in_flight  # model -> requests queued or running
        self.dispatch = Dispatcher(  # admission/priority.py
            spec.models, list(self.backends), ingress_replicas(spec)
        )
        self.max_model_len = {m.name: m.max_model_len for m in spec.models}
        self.parser = RequestParser(self.max_model_len)
        self.salter = CacheSalter(salt_key())  # shared by all ingress replicas
        self.health_cache = HealthCache(self.backends)
        self.poison = PoisonList(clock)  # requests that crashed replicas (serve/poison.py)

    def set_tenants(self, tenants: Sequence[TenantSpec]) -> None:
        """Replace the tenants, keys and limits (the ingress's user_config changed:
        agentserve.tenant_config); requests in flight finish under their old lease."""
        self.tenants = TenantResolver(self.spec, tenants)
        self.shares.set_tenants(self.tenants.tenants())
        self.metrics.set_slas(sla_objectives(self.spec, tenants))

    # -- admission ---------------------------------------------------------------------
    async def admit(
        self, model: str, tenant: Tenant, reserve_tokens: int = 0, count: int = 1
    ) -> AdmittedCall:
        """Take `count` places (its choices) in the model's queue (404, 503 full, 429 past
        the tenant's fair share) and one in the tenant's limits, reserving
        `reserve_tokens` (429)."""
        self.shares.admit(model, tenant, count)
        try:
            lease = await self.quota.admit(tenant, reserve_tokens, count)  # n counts n
        except BaseException:
            self.shares.release(model, tenant.name, count)
            raise
        self.metrics.in_flight.labels(model).inc()
        self.metrics.queued.labels(model).inc()
        return AdmittedCall(model, tenant.name, self.clock(), lease, count=count)

    def close(self, call: AdmittedCall, status: int) -> None:
        if call.closed:
            return
        call.closed = True
        if call.first is None:
            self.metrics.queued.labels(call.model).dec()
        self.shares.release(call.model, call.tenant, call.count)
        if call.sent:
            self.dispatch.release(call.model, call.sent)
            call.sent = 0
        self.metrics.in_flight.labels(call.model).dec()
        call.lease.finish(call.prompt_tokens + call.completion_tokens)
        self.metrics.observe_request(
            call.model,
            call.tenant,
            ttft_s=call.ttft(call.start),
            decode_s=call.decode_time(),
            prompt_tokens=call.prompt_tokens,
            output_tokens=call.completion_tokens,
            status=status,
        )
        if call.span is not None:
            spans.end_ingress(
                call.span,
                status,
                model=call.model,
                tenant=call.tenant,
                ttft_s=call.ttft(call.start),
                prompt_tokens=call.prompt_tokens,
                output_tokens=call.completion_tokens,
                finish_reason=call.finish_reason,
            )

    def see(self, call: AdmittedCall, delta: Delta) -> None:
        if call.see(delta, self.clock()):  # its first output: no longer queued
            self.metrics.queued.labels(call.model).dec()

    # -- generation --------------------------------------------------------------------
    async def complete(
        self, kind: RequestKind, request: Request, responses: ResponsesRequest | None = None
    ) -> Response:
        """A chat or text completion; with `responses`, a /v1/responses request served
        as the chat completion it translates to (api/responses.py)."""
        span = spans.start_ingress(self.tracer, kind, request.headers)
        try:
            tenant = self.tenants.resolve(request.headers.get("authorization"))
            raw = await read_body(request, self.spec.server.max_request_body_bytes)
            translate = responses.translate if responses is not None else None
            # schemas: admitted first, then checked on the tenant's turns (admission/admit_first.py)
            body, call = await parse_and_admit(self, kind, raw, translate, tenant)
        except APIError as err:  # rejected before admission: 400/401/404/429/503
            if responses is not None:
                responses.rename(err)
            spans.end_ingress(span, err.status)
            raise
        call.span = span
        status = 500
        try:
            self.poison.check(tenant.name, kind, body)  # 400 when it crashed replicas
            cap = buffer_cap(kind, body, self.max_model_len.get(body.model))  # 400 if huge
            engine_request = self._engine_request(kind, body, request, tenant, span)
            ready = await self.backends[body.model].ready_replicas()
            await self.dispatch.send(body.model, tenant, call.count, ready)
            call.sent = call.count  # released in close()
            stream = fan_out(  # n > 1: one engine request per choice, merged
                engine_request,
                lambda r: migrating(  # continues on another replica when this one dies
                    self.backends[body.model].generate,
                    r,
                    self.spec.server.max_migrations,
                    on_migrate=lambda _: self.metrics.migrations.labels(body.model).inc(),
                    on_poison=lambda: self.poison.add(tenant.name, kind, body),
                ),
            )
            stream = capped(stream, cap)  # a non-stream answer buffers at most `cap` bytes
            first = await self._first_or_hold(body.model, stream, ready)
            self.see(call, first)
            if responses is not None:
                builder = ResponsesBuilder(engine_request.request_id, body.model, responses.echo)
                frames = builder
            else:
                builder = ResponseBuilder(
                    kind, engine_request.request_id, body.model, _include_usage(body), body.n or 1
                )
                frames = ChatFrames(builder)
            headers = {"x-request-id": request.headers.get("x-request-id", builder.id)}
            if body.stream:
                status = 200
                events = self._sse(call, frames, first, stream)
                return StreamingResponse(events, media_type="text/event-stream", headers=headers)
            deltas = await self._collect(call, first, stream, request)
            if deltas is None:  # the client went away: generation aborted
                status = CLIENT_CLOSED
                return Response(status_code=CLIENT_CLOSED)
            status = 200
            return JSONResponse(builder.final(deltas), headers=headers)
        except APIError as err:
            status = err.status
            raise
        except EngineRequestError as err:
            status = err.status
            if responses is not None:
                responses.rename(err)
            raise
        except EngineUnavailableError:
            status = 503
            raise
        except asyncio.CancelledError:  # the client went away (Ray Serve cancels)
            status = CLIENT_CLOSED
            raise
        finally:
            if not (status == 200 and body.stream):
                self.close(call, status)

    async def _collect(
        self, call: AdmittedCall, first: Delta, stream: AsyncIterator[Delta], request: Request
    ) -> list[Delta] | None:
        """All deltas of a non-stream request; None when its client disconnects first
        (the generation is then cancelled, which aborts it in the engine)."""
        deltas = [first]

        async def drain() -> None:
            async for delta in stream:
                self.see(call, delta)
                deltas.append(delta)

        drained = asyncio.ensure_future(drain())
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({drained, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (drained, gone):
                task.cancel()
            await asyncio.gather(drained, gone, return_exceptions=True)
            await _aclose(stream)
        if drained.cancelled():
            return None
        drained.result()  # an engine error is raised here
        return deltas

    async def _first_or_hold(
        self, model: str, stream: AsyncIterator[Delta], ready: int | None
    ) -> Delta:
        """The first delta. While the model has no ready replica (scaled to zero or
        starting), the request is held (it waits in Serve's router, which is also what
        triggers the scale-up) for at most cold_start_hold_timeout_s, then refused with
        503 and Retry-After. `ready`: the model's ready replicas (None = unknown)."""
        if ready is None or ready > 0:
            return await _first_delta(stream)
        hold_s = self.spec.autoscaling.cold_start_hold_timeout_s
        try:
            return await asyncio.wait_for(_first_delta(stream), hold_s)
        except TimeoutError:
            raise OverloadedError(
                f"model {model!r} is starting (no ready replica) and did not answer within "
                f"{hold_s:g} s; retry later",
                retry_after_s=COLD_START_RETRY_AFTER_S,
            ) from None

    async def _sse(
        self,
        call: AdmittedCall,
        frames: ChatFrames | ResponsesBuilder,
        first: Delta,
        stream: AsyncIterator[Delta],
    ) -> AsyncIterator[bytes]:
        """SSE bytes (api/sse.py's frames: start, one frame per delta, end); closes `call`."""
        status = 200
        try:
            for frame in (frames.start(), frames.delta(first)):
                if frame:
                    yield frame
            async for delta in stream:
                self.see(call, delta)
                if frame := frames.delta(delta):
                    yield frame
            yield frames.end(call.prompt_tokens, call.completion_tokens)
        except EngineError as err:  # after the 200 header: report in-band, OpenAI style
            status = getattr(err, "status", 503 if isinstance(err, EngineUnavailableError) else 500)
            yield frames.error(error_body(err))
        except (asyncio.CancelledError, GeneratorExit):  # the client went away
            status = CLIENT_CLOSED
            raise
        except Exception:  # a bug mid-stream: still end the stream with an error event
            log.exception("unhandled error in a stream")
            status = 500
            yield frames.error(error_body(RuntimeError()))
        finally:
            await _aclose(stream)
            self.close(call, status)

    def _engine_request(
        self, kind: RequestKind, body, request: Request, tenant: Tenant, span: Span
    ) -> EngineRequest:
        """`body` (left as parsed) with this ingress's decisions (serve/engine_request.py)."""
        headers = engine_headers(span, request.headers, tenant.name)
        priority = self.dispatch.priority(body.model, tenant)  # admission/priority.py
        salt = self.salter.salt(tenant.name, body.cache_salt)  # no shared prefixes
        return engine_request(
            kind, body, request_id=uuid.uuid4().hex, headers=headers, priority=priority,
            cache_salt=salt,
        )  # fmt: skip

    # -- other endpoints ---------------------------------------------------------------
    def models(self, request: Request) -> dict:
        from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList

        self.tenants.resolve(request.headers.get("authorization"))
        cards = [
            ModelCard(id=name, owned_by="agentserve", max_model_len=self.max_model_len.get(name))
            for name in self.backends
        ]
        return ModelList(data=cards).model_dump(mode="json", exclude_none=True)

    async def health(self) -> JSONResponse:
        return await self.health_cache.response()  # serve/health.py: 1 s, one in flight

    async def metrics_text(self) -> Response:
        for name, backend in self.backends.items():
            with contextlib.suppress(Exception):  # replica count is best effort
                ready = await asyncio.wait_for(backend.ready_replicas(), STATS_TIMEOUT_S)
                if ready is not None:
                    self.metrics.replicas.labels(name).set(ready)
            try:
                stats = await asyncio.wait_for(backend.stats(), STATS_TIMEOUT_S)
            except Exception:  # a slow or dead replica must not break scraping
                log.warning("engine stats for %s unavailable", name, exc_info=True)
                self.metrics.engine_up.labels(name).set(0)
                continue
            self.metrics.engine_up.labels(name).set(1)
            self.metrics.set_engine_stats(name, stats)
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)


async def _first_delta(stream: AsyncIterator[Delta]) -> Delta:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        raise EngineUnavailableError("the engine ended the request without output") from None
    except BaseException:
        await _aclose(stream)
        raise


async def _client_gone(request: Request) -> None:
    """Returns once the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _aclose(stream: AsyncIterator[Delta]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


def _include_usage(body) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def create_app(
    spec: DeploymentSpec,
    backends: Mapping[str, ModelBackend],
    *,
    clock: Callable[[], float] = time.perf_counter,
    tracer: Tracer | None = None,
    tenants: Sequence[TenantSpec] | None = None,
    quota: LocalQuota | SharedQuota | None = None,
) -> FastAPI:
    """The ingress ASGI app for `spec`, serving the models in `backends` (name -> backend).

    Backends are injected: LocalBackend(engine) in tests, Ray handles in serve/app.py.
    `tracer` records the ingress span of each request (None: no spans; the caller's trace
    headers are still passed on). `tenants` None: the spec's; a list (the Serve
    ingress's user_config): those, a key always required; `set_tenants` replaces them.
    """
    ingress = _Ingress(spec, backends, clock, tracer or NoOpTracer(), tenants, quota)
    # The ingress process holds ~600k objects from importing vLLM; a full (gen 2) garbage
    # collection over them holds the GIL 100-500 ms, stalling every stream. Frozen objects
    # are never scanned again: later collections see only what requests allocate.
    gc.freeze()
    app = FastAPI(
        title="agentserve",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind the API key
        lifespan=admin_lifespan(spec),
    )
    app.add_middleware(AdminGate, metrics_port=spec.server.metrics_port)  # serve/admin.py
    open_mode = ingress.tenants.open_mode  # then only trusted hosts, JSON POSTs
    app.add_middleware(OpenModeGuard, trusted=trusted_hosts(spec) if open_mode else None)
    app.add_middleware(UnauthenticatedLimit, keys_required=lambda: not ingress.tenants.open_mode)
    app.state.ingress = ingress
    install_error_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await ingress.complete("chat", request)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await ingress.complete("chat", request, ResponsesRequest())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await ingress.complete("completion", request)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        return ingress.models(request)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> dict:
        ingress.tenants.resolve(request.headers.get("authorization"))
        return app.openapi()

    @app.get("/health")
    async def health() -> Response:
        return await ingress.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        return await ingress.metrics_text()

    return app

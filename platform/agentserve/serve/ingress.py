"""The OpenAI-compatible ingress as a plain FastAPI app; serve/app.py hosts it in Ray Serve.

The request path (docs/architecture.md), a stage each, composed in `_Ingress._path`:
  edge            open mode: trusted Host, JSON POSTs; unauthenticated requests' limit;
                  admin paths off the API port (serve/edge.py)               400/415/429
  1. authenticate Authorization: Bearer -> tenant (api/auth.TenantResolver)  401
  2. read         the body within server.max_request_body_bytes and
                  body_read_timeout_s (api/body); at most max_unadmitted_per_tenant
                  of a tenant's requests read or parse at once (serve/unadmitted)
                                                                             408/413/429
  3. parse        validated off the event loop; a body with schemas or over 64 KiB after
  4. admit        its admission (admission/admit.py Admit): model queue and fair share,
                  tenant limits, tokens reserved                             400/404/429/503
  5. dispatch     poison and buffer checks, a slot toward the replicas (earliest deadline
                  first), the engine stream (migrating, n merged), its first delta, held
                  at most cold_start_hold_timeout_s with no ready replica (stages.Dispatch)
                                                                             400/429/503/4xx
  6. stream       JSON or SSE in the API's shape (reply.Reply), an SSE frame pulled only
                  when the client took the last; a client taking nothing for
                  server.stream_stall_timeout_s ends it (serve/stream_guard.py)
  7. close        what the request holds given back, metrics and the ingress span recorded,
                  once, however the request ended (stages.Close)
/v1/responses is a chat completion on this path (api/responses.py); /v1/embeddings takes the
same stages for embedding models, answered whole (serve/embeddings.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response
from opentelemetry.trace import NoOpTracer, Tracer

from agentserve.api.auth import TenantResolver
from agentserve.api.body import read_body
from agentserve.api.responses import ResponsesRequest
from agentserve.serve.edge import edge_app
from agentserve.serve.embeddings import EmbeddingsPath
from agentserve.serve.endpoints import Endpoints, serving_metrics
from agentserve.serve.reply import Reply
from agentserve.serve.stages import Backends, Held, request_stages
from agentserve.serve.stream_guard import GuardedStream
from agentserve.serve.unadmitted import Unadmitted

if TYPE_CHECKING:
    from agentserve.admission.admit import Quota
    from agentserve.engine.protocol import RequestKind
    from agentserve.serve.held_board import HeldStore
    from agentserve.spec import DeploymentSpec, TenantSpec

__all__ = ["create_app"]


class _Ingress:
    """Holds the stages and the injected parts; its methods are the route bodies."""

    def __init__(
        self,
        spec: DeploymentSpec,
        backends: Backends,
        clock: Callable[[], float],
        tracer: Tracer,
        tenants: Sequence[TenantSpec] | None = None,
        quota: Quota | None = None,
        board: tuple[HeldStore, str] | None = None,
    ):
        self.spec, self.backends, self.clock = spec, dict(backends), clock
        self.tracer = tracer
        self.tenants = TenantResolver(spec, tenants)
        metrics, capacity = serving_metrics(spec, self.backends, tenants)
        self.admit_stage, self.dispatch_stage, self.close_stage = request_stages(
            spec, self.backends, capacity, metrics, clock, quota, board
        )
        self.embeddings = EmbeddingsPath(  # /v1/embeddings on the same stages
            spec, self.admit_stage, self.dispatch_stage, self.close_stage, tracer
        )
        self.admit_stage.shares.set_tenants(self.tenants.tenants())
        self.endpoints = Endpoints(  # /v1/models, /health, /metrics
            spec, self.backends, metrics, self.admit_stage.names, self.admit_stage.max_model_len,
            lambda: self.tenants,
        )  # fmt: skip
        self.unadmitted = Unadmitted(_unadmitted_limit(spec, self.tenants))

    def set_tenants(self, tenants: Sequence[TenantSpec]) -> None:
        """Replace the tenants, keys and limits (the ingress's user_config changed:
        agentserve.tenant_config); requests in flight finish under their old lease."""
        self.tenants = TenantResolver(self.spec, tenants)
        self.unadmitted.limit = _unadmitted_limit(self.spec, self.tenants)
        self.admit_stage.shares.set_tenants(self.tenants.tenants())
        self.endpoints.set_tenants(tenants)

    # -- the request path --------------------------------------------------------------
    async def complete(
        self, kind: RequestKind, request: Request, responses: ResponsesRequest | None = None
    ) -> Response:
        """A chat or text completion; with `responses`, a /v1/responses request served
        as the chat completion it translates to (api/responses.py)."""
        path = self._path(kind, request, responses)
        head = await anext(path)  # an error before the answer raises here, closed
        if isinstance(head, Response):  # the whole answer
            await path.aclose()  # 7. close
            return head
        stall_s = self.spec.server.stream_stall_timeout_s  # serve/stream_guard.py
        return GuardedStream(path, stall_s, headers=head, media_type="text/event-stream")

    async def _path(
        self, kind: RequestKind, request: Request, responses: ResponsesRequest | None
    ) -> AsyncIterator[Response | dict[str, str] | bytes]:
        """The stages in order. Yields the whole answer, or a stream's headers and then its
        SSE bytes; the close stage runs once, whichever stage ended the request."""
        held = Held.start(self.tracer, kind, request.headers, self.close_stage)  # what it holds
        try:
            tenant = self.tenants.resolve(request.headers.get("authorization"))  # 1.
            server = self.spec.server
            with self.unadmitted.hold(tenant.name):  # 429 past the tenant's unadmitted cap
                raw = await read_body(
                    request, server.max_request_body_bytes, server.body_read_timeout_s
                )  # 2.
                ask = await self.admit_stage(kind, raw, tenant, responses, held)  # 3., 4.
            request_id, first = await self.dispatch_stage(ask, request, tenant, held)
            see = functools.partial(self.admit_stage.see, held.call)
            reply = Reply(ask, request_id, request, responses, held, see)  # 6.
            if not ask.stream:
                yield await reply.json(first)
                return
            yield reply.headers
            async with contextlib.aclosing(reply.sse(first)) as frames:
                async for frame in frames:
                    yield frame
        except BaseException as err:
            held.fail(err, responses)
            raise
        finally:
            await self.close_stage(held)  # 7.


def _unadmitted_limit(spec: DeploymentSpec, tenants: TenantResolver) -> int | None:
    """server.max_unadmitted_per_tenant; None in open mode (one tenant: every client)."""
    return None if tenants.open_mode else spec.server.max_unadmitted_per_tenant


def create_app(
    spec: DeploymentSpec,
    backends: Backends,
    *,
    clock: Callable[[], float] = time.perf_counter,
    tracer: Tracer | None = None,
    tenants: Sequence[TenantSpec] | None = None,
    quota: Quota | None = None,
    board: tuple[HeldStore, str] | None = None,
) -> FastAPI:
    """The ingress ASGI app for `spec`, serving the models in `backends` (name -> backend).

    Backends are injected: LocalBackend(engine) in tests, Ray handles in serve/app.py.
    `tracer` records the ingress span of each request (None: no spans; the caller's trace
    headers are still passed on). `tenants` None: the spec's; a list (the Serve
    ingress's user_config): those, a key always required; `set_tenants` replaces them.
    `board`: (store, scope) where the ingress publishes the requests it holds, for the
    autoscaler (serve/held_board.py; serve/app.py passes Ray's GCS key-value store).
    """
    ingress = _Ingress(spec, backends, clock, tracer or NoOpTracer(), tenants, quota, board)
    # The ingress process holds ~600k objects from importing vLLM; a full (gen 2) garbage
    # collection over them holds the GIL 100-500 ms, stalling every stream. Frozen objects
    # are never scanned again: later collections see only what requests allocate.
    gc.freeze()
    keys_required = lambda: not ingress.tenants.open_mode  # noqa: E731
    app = edge_app(spec, ingress.tenants.open_mode, keys_required)  # serve/edge.py
    app.state.ingress = ingress

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await ingress.complete("chat", request)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await ingress.complete("chat", request, ResponsesRequest())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await ingress.complete("completion", request)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await ingress.embeddings(request, ingress.tenants)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        return ingress.endpoints.models(request)

    @app.get("/v1/models/{model_id:path}")  # names may hold "/" (org/model)
    async def model(request: Request, model_id: str) -> dict:
        return ingress.endpoints.model(request, model_id)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> dict:
        ingress.tenants.resolve(request.headers.get("authorization"))
        return app.openapi()

    @app.get("/health")
    async def health(request: Request) -> Response:
        return await ingress.endpoints.health(request)

    @app.get("/metrics")
    async def metrics() -> Response:
        return await ingress.endpoints.metrics_text()

    return app

"""/v1/embeddings on the ingress's stages (serve/stages.py): the same authentication,
body limit, admission (model queue, tenant fair share and limits, tokens reserved),
dispatch slots, metrics and ingress span as a completion, for a model whose
ModelSpec.task is "embed". One engine call answers the whole request (Engine.embed: no
stream); a replica that dies under it is retried on another, up to server.max_migrations
times (an embedding is idempotent).

Errors: 401 bad key, 413 body too large, 400 bad body (api/embeddings.py), 404 unknown
model, 400 model_not_embedding for a model that generates (a chat or completion request
to an embedding model gets model_not_generative from admission/admit.py), 429/503 as for
completions.
"""

from __future__ import annotations

import uuid

from fastapi import Request
from fastapi.responses import JSONResponse
from opentelemetry.trace import Tracer

from agentserve.admission.admit import Admit
from agentserve.admission.shares import prompt_tokens
from agentserve.api.auth import Tenant, TenantResolver
from agentserve.api.body import decode_json, read_body
from agentserve.api.embeddings import (
    EmbeddingsRequest,
    embed_only,
    embeddings_response,
    parse_embeddings,
)
from agentserve.api.errors import ModelNotFoundError
from agentserve.engine.protocol import Delta, Embeddings, EmbedRequest, EngineDeadError
from agentserve.serve import spans
from agentserve.serve.engine_request import engine_headers
from agentserve.serve.stages import Close, Dispatch, Held, held_for_cold_start
from agentserve.spec import DeploymentSpec

__all__ = ["EmbeddingsPath"]


class EmbeddingsPath:
    """The route body of POST /v1/embeddings; the stages are the ingress's own."""

    def __init__(
        self,
        spec: DeploymentSpec,
        admit: Admit,
        dispatch: Dispatch,
        close: Close,
        tracer: Tracer,
    ):
        self.spec, self.admit, self.dispatch, self.close = spec, admit, dispatch, close
        self.tracer = tracer

    async def __call__(self, request: Request, tenants: TenantResolver) -> JSONResponse:
        """Authenticate, read, parse, admit, dispatch, answer, close (once)."""
        held = Held.start(self.tracer, "embeddings", request.headers, self.close)
        try:
            tenant = tenants.resolve(request.headers.get("authorization"))  # 401
            raw = await read_body(request, self.spec.server.max_request_body_bytes)  # 413
            body = parse_embeddings(decode_json(raw))  # 400
            self._check_model(body.model)  # 404, 400
            await self.admit.take(held, body.model, tenant, _reserve(body))  # 429, 503
            result = await self._dispatch(body, request, tenant, held)
            held.finish(200)
            return JSONResponse(embeddings_response(body, result.vectors, result.prompt_tokens))
        except BaseException as err:
            held.fail(err, None)
            raise
        finally:
            await self.close(held)

    def _check_model(self, model: str) -> None:
        if model not in self.dispatch.backends:
            raise ModelNotFoundError(model, list(self.dispatch.backends))
        embed_only(model, self.admit.embedders)

    async def _dispatch(
        self, body: EmbeddingsRequest, request: Request, tenant: Tenant, held: Held
    ) -> Embeddings:
        """A slot toward the replicas, then the engine's answer; its tokens counted on the
        call (usage, quota, metrics), its latency as the request's time to first output."""
        call, model = held.call, body.model
        request_id = uuid.uuid4().hex
        headers = engine_headers(held.span, request.headers, tenant.name)
        spans.name_request(held.span, request_id, model)
        ready = await self.dispatch.backends[model].ready_replicas()
        await self.dispatch.send(held, model, tenant, ready)
        result = await self._embed(model, EmbedRequest(request_id, body.inputs, headers), ready)
        self.admit.see(call, Delta(prompt_tokens=result.prompt_tokens, finish_reason="stop"))
        call.finish_reasons.clear()  # an embedding has no finish reason
        return result

    async def _embed(self, model: str, request: EmbedRequest, ready: int | None) -> Embeddings:
        """The engine's answer, retried when its replica died; held at most
        cold_start_hold_timeout_s while the model has no ready replica (then 503)."""
        cold = ready is not None and ready <= 0
        hold_s = self.spec.autoscaling.cold_start_hold_timeout_s if cold else None
        return await held_for_cold_start(self._retried(model, request), model, hold_s)

    async def _retried(self, model: str, request: EmbedRequest) -> Embeddings:
        backend, retries = self.dispatch.backends[model], self.spec.server.max_migrations
        attempt = 0
        while True:
            try:
                return await backend.embed(request)
            except EngineDeadError:
                if attempt >= retries:
                    raise
                attempt += 1
                self.admit.metrics.migrations.labels(model).inc()


def _reserve(body: EmbeddingsRequest) -> int:
    """Tokens to reserve at admission: the inputs' estimated tokens (no output)."""
    return sum(
        len(item) if isinstance(item, tuple)
        else prompt_tokens(item)
        for item in body.inputs
    )  # fmt: skip

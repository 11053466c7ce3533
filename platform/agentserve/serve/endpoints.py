"""The ingress's endpoints beside the request path: the model list and cards (/v1/models),
/health and /metrics, and the serving metrics (serve/metrics.py) that the stages record
and /metrics exposes. serve/ingress.py routes to them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from agentserve.api.auth import TenantResolver
from agentserve.api.errors import AuthenticationError, ModelNotFoundError
from agentserve.serve.admin import is_loopback_client
from agentserve.serve.cached import Cached
from agentserve.serve.health import HealthCache
from agentserve.serve.metrics import CONTENT_TYPE, ServingMetrics, model_limits, sla_objectives

if TYPE_CHECKING:
    from agentserve.admission.adapter_names import ModelNames
    from agentserve.serve.stages import Backends
    from agentserve.spec import DeploymentSpec, TenantSpec

__all__ = ["Endpoints", "serving_metrics"]

log = logging.getLogger("agentserve.serve.ingress")
STATS_TIMEOUT_S = 2.0


def serving_metrics(
    spec: DeploymentSpec, backends: Backends, tenants: Sequence[TenantSpec] | None
) -> tuple[ServingMetrics, dict[str, int]]:
    """The ingress's metrics, and each served model's capacity (admission/shares.py; a
    model without limits: server.max_queue_len)."""
    limits = model_limits(spec)
    queue = spec.server.max_queue_len
    capacity = {n: limits[n].capacity if n in limits else queue for n in backends}
    return ServingMetrics(sla_objectives(spec, tenants), limits), capacity


class Endpoints:
    """/v1/models, /v1/models/{id}, /health and /metrics. `tenants()`: the ingress's
    current TenantResolver (set_tenants replaces it)."""

    def __init__(
        self,
        spec: DeploymentSpec,
        backends: Backends,
        metrics: ServingMetrics,
        names: ModelNames,
        max_model_len: Mapping[str, int],
        tenants: Callable[[], TenantResolver],
    ):
        self.spec, self.backends, self.metrics, self.names = spec, backends, metrics, names
        self.max_model_len, self.tenants = max_model_len, tenants
        self.health_cache = HealthCache(backends)
        self.metrics_cache = Cached(self._metrics_body)  # one scrape's work per second

    def set_tenants(self, tenants: Sequence[TenantSpec]) -> None:
        """The tenants' SLA objectives changed (the ingress's set_tenants)."""
        self.metrics.set_slas(sla_objectives(self.spec, tenants))

    def models(self, request: Request) -> dict:
        from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList

        self.tenants().resolve(request.headers.get("authorization"))
        cards = [
            ModelCard(id=name, owned_by="agentserve", max_model_len=self.max_model_len.get(name))
            for name in self.backends
        ]
        cards += [  # LoRA adapters, as vLLM lists them: the base model their parent
            ModelCard(
                id=adapter,
                owned_by="agentserve",
                parent=parent,
                max_model_len=self.max_model_len.get(parent),
            )
            for adapter, parent in self.names.parents.items()
            if parent in self.backends
        ]
        return ModelList(data=cards).model_dump(mode="json", exclude_none=True)

    def model(self, request: Request, model_id: str) -> dict:
        """GET /v1/models/{id}: the model's card, or 404 model_not_found."""
        for card in self.models(request)["data"]:
            if card["id"] == model_id:
                return card
        raise ModelNotFoundError(model_id, self.names.served())

    async def health(self, request: Request) -> JSONResponse:
        """{"status", "models": {name: state}}, cached (serve/health.py: 1 s, one in flight).
        The model names only for a caller that may list the models (a valid key, or no keys
        configured), on loopback or on the admin port: probes need the status code alone."""
        status, body = await self.health_cache.answer()
        if not self._may_see_models(request):
            body = {"status": body["status"]}
        return JSONResponse(body, status_code=status)

    def _may_see_models(self, request: Request) -> bool:
        metrics_port = self.spec.server.metrics_port
        server = request.scope.get("server") or (None, None)
        if metrics_port is not None and server[1] == metrics_port:
            return True
        if is_loopback_client(request.scope.get("client")):
            return True
        try:
            self.tenants().resolve(request.headers.get("authorization"))
        except AuthenticationError:
            return False
        return True

    async def metrics_text(self) -> Response:
        """The Prometheus exposition, computed at most once per ADMIN_TTL_S for all
        scrapers (each computation asks every model for its stats)."""
        return Response(await self.metrics_cache.get(), media_type=CONTENT_TYPE)

    async def _metrics_body(self) -> bytes:
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
        return self.metrics.exposition()

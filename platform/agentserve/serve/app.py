"""build_app(spec) -> Ray Serve application: one FastAPI ingress + one deployment per model.

The ingress deployment hosts serve/ingress.create_app with a HandleBackend per model, so
all HTTP logic is the same code the unit tests run without Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from agentserve.admission.priority import replica_slots
from agentserve.admission.quota_keeper import QuotaKeeper
from agentserve.admission.shared_limits import SharedQuota
from agentserve.admission.shares import ingress_replicas, model_capacity
from agentserve.autoscale.gpu_latency import is_roofline_prior, policy_latency_model
from agentserve.autoscale.ray_policy import ray_autoscaling_config
from agentserve.engine.protocol import (
    Delta,
    Embeddings,
    EmbedRequest,
    EngineDeadError,
    EngineError,
    EngineGoneError,
    EngineRequest,
    EngineStats,
    EngineUnavailableError,
)
from agentserve.engine.registry import engine_class
from agentserve.placement import replica_placement
from agentserve.serve.affinity_router import ROUTER_PATH
from agentserve.serve.gcs_board import held_board
from agentserve.serve.names import INGRESS_NAME, QUOTA_NAME, deployment_name
from agentserve.serve.replica import EngineFactory, ModelReplica, default_engine_factory
from agentserve.serve.status import add_status_route, replica_states
from agentserve.spec import (
    DeploymentSpec,
    ModelSpec,
    SLASpec,
    TenantSpec,
    spec_from_dict,
)
from agentserve.tenant_config import (
    TENANTS_FROM_USER_CONFIG,
    ingress_user_config,
    spec_from_app_args,
    tenants_from_user_config,
)
from agentserve.tracing import close_tracer, make_tracer

__all__ = [
    "HandleBackend",
    "build_app",
    "build_app_from_args",
    "deployment_options",
    "ingress_options",
    "router_config",
]

INGRESS_SPARE_REQUESTS = 64  # over the models' capacity: refusals, health, metrics
READY_CACHE_S = 1.0  # a model's ready-replica count, while it is 0 or unknown
READY_CACHE_UP_S = 5.0  # ... and while it is positive
log = logging.getLogger(__name__)


class HandleBackend:
    """ModelBackend over a Ray Serve handle to a ModelReplica deployment.

    Ray errors become engine errors: back-pressure and missing replicas -> EngineUnavailable
    (503); a replica actor that died or became unreachable -> EngineDead (the ingress
    continues the request elsewhere); an EngineError raised in the replica is re-raised.
    """

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle
        self._ready: tuple[float, int | None] | None = None  # (monotonic time, count)
        self._refresh: asyncio.Future | None = None  # the status call in flight

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        responses, finished, received = None, False, False
        try:  # remote() itself raises BackPressureError when the handle's queue is full
            responses = self.handle.options(stream=True).generate_batches.remote(request)
            async for batch in responses:  # a replica sends what it has, merged
                received = True
                for delta in batch:
                    yield delta
            finished = True
        except (BackPressureError, DeploymentUnavailableError) as err:
            raise EngineUnavailableError(str(err)) from None
        except RayActorError as err:
            raise _replica_died(self.handle, err, received) from None
        except RayTaskError as err:
            if isinstance(getattr(err, "cause", None), RayActorError):
                raise _replica_died(self.handle, err.cause, received) from None
            raise _engine_cause(err) from None
        finally:
            if not finished and responses is not None:
                # cancel() re-raises an assignment failure (e.g. BackPressureError): the
                # error above is the one to report
                with contextlib.suppress(Exception):
                    responses.cancel()

    async def embed(self, request: EmbedRequest) -> Embeddings:
        try:
            return await self.handle.embed.remote(request)
        except (BackPressureError, DeploymentUnavailableError) as err:
            raise EngineUnavailableError(str(err)) from None
        except RayActorError as err:
            raise _replica_died(self.handle, err) from None
        except RayTaskError as err:
            if isinstance(getattr(err, "cause", None), RayActorError):
                raise _replica_died(self.handle, err.cause) from None
            raise _engine_cause(err) from None

    async def stats(self) -> EngineStats:
        return await self.handle.stats.remote()

    async def health(self) -> None:
        try:
            await self.handle.health.remote()
        except RayTaskError as err:
            raise _engine_cause(err) from None

    async def ready_replicas(self) -> int | None:
        """RUNNING replicas per Serve's controller; None when the controller cannot say.
        A count is reused for READY_CACHE_S, or READY_CACHE_UP_S while it is positive
        (only a model with no replica needs it fresh: its requests are held, not queued);
        requests that find it stale share one status call. Serve's status call costs
        milliseconds of the ingress's CPU (it serialises each deployment's config)."""
        if self._ready is not None:
            at, count = self._ready
            if time.monotonic() - at < (READY_CACHE_UP_S if count else READY_CACHE_S):
                return count
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(self._read_ready())
        return await asyncio.shield(self._refresh)

    async def _read_ready(self) -> int | None:
        try:
            app, name = self.handle.app_name, self.handle.deployment_name
            count = await asyncio.to_thread(_running_replicas, app, name)
            self._ready = (time.monotonic(), count)
            return count
        finally:
            self._refresh = None


def _running_replicas(app: str, deployment: str) -> int | None:
    """RUNNING replicas of one deployment (a blocking call to the Serve controller)."""
    try:
        states = replica_states(app, deployment)
    except Exception:  # unknown is not "cold": the ingress then waits without a bound
        log.warning("replica count of %s/%s unavailable", app, deployment, exc_info=True)
        return None
    return int(states.get("RUNNING", 0))


def _engine_cause(err: RayTaskError) -> Exception:
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, EngineError) else err


def _replica_died(
    handle: DeploymentHandle, err: RayActorError, received: bool = True
) -> EngineDeadError:
    """EngineDeadError for a dead replica actor; Ray's details (pid, ip) only in the log.
    An actor that was gone before it sent anything (a request routed to a replica that had
    just exited): EngineGoneError, not a death of this request (serve/poison.py)."""
    log.warning("a replica of %s died mid-request: %s", handle.deployment_name, err)
    actor = getattr(err, "actor_id", None)
    replica = None if actor is None else str(actor)
    if not received:
        return EngineGoneError(f"a replica of {handle.deployment_name} was gone", replica)
    return EngineDeadError(
        f"a replica of {handle.deployment_name} died during the request", replica
    )


@serve.ingress()
class Ingress:
    """Ingress deployment: builds the FastAPI app at replica start, with handles to models.

    With `tenants_apart` the tenants (keys, SLAs, limits) come from the deployment's
    user_config through `reconfigure` (agentserve.tenant_config), so rotating a key
    updates this deployment in place and no model replica restarts; until the first
    reconfigure every request needs a key and none is valid.
    """

    def __init__(
        self,
        spec: DeploymentSpec,
        models: dict[str, DeploymentHandle],
        tenants_apart: bool = False,
        quota: DeploymentHandle | None = None,
    ):
        self.spec = spec
        self.models = models
        self.quota = quota
        self.tenants: list[TenantSpec] | None = [] if tenants_apart else None
        self.asgi: Any = None

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """user_config {"tenants": [...]}: replace the tenants (a SpecError keeps the old)."""
        self.tenants = tenants_from_user_config(user_config)
        if self.asgi is not None:
            self.asgi.state.ingress.set_tenants(self.tenants)
        log.info("ingress tenants updated: %d tenant(s)", len(self.tenants))

    def __serve_build_asgi_app__(self) -> Any:
        # lazy: the ingress imports vLLM's protocol models (api/openai.py); only the
        # ingress replica needs them, not every process that imports this module
        from agentserve.serve.ingress import create_app

        tracer = self._tracer = make_tracer(self.spec.tracing, os.environ, "ingress")
        backends = {n: HandleBackend(h) for n, h in self.models.items()}
        spec = replica_admin_port(self.spec, _local_rank())
        quota = None
        if self.quota is not None:
            quota = SharedQuota(self.quota, ingress_replicas(spec))
        board = held_board(spec)  # the requests it holds, for the autoscaler
        app = create_app(
            spec, backends, tracer=tracer, tenants=self.tenants, quota=quota, board=board
        )
        add_status_route(app)  # GET /status: Serve deployments and replicas
        self.asgi = app
        return app

    async def __del__(self) -> None:
        """Serve stops this replica: export the spans its tracer still holds, withdraw
        what it published on the held-requests board."""
        board = self.asgi.state.ingress.dispatch_stage.board if self.asgi is not None else None
        if board is not None:
            await board.aclose()
        tracer = getattr(self, "_tracer", None)
        if tracer is not None:
            await asyncio.to_thread(close_tracer, tracer)


def _local_rank() -> int:
    """This replica's rank among its deployment's replicas on its node (0 if unknown)."""
    try:
        return int(serve.get_replica_context().rank.local_rank)
    except Exception:
        return 0


def replica_admin_port(spec: DeploymentSpec, local_rank: int) -> DeploymentSpec:
    """The spec as ingress replica `local_rank` of its node serves it: admin endpoints on
    metrics_port + local_rank, so replicas sharing a node do not fight over one port."""
    port = spec.server.metrics_port
    if port is None or local_rank == 0:
        return spec
    server = spec.server.model_copy(update={"metrics_port": port + local_rank})
    return spec.model_copy(update={"server": server})


def deployment_options(
    model: ModelSpec, spec: DeploymentSpec, tenant_slas: Mapping[str, SLASpec] | None = None
) -> dict[str, Any]:
    """Ray Serve options for one model's deployment, from the spec (pure);
    `tenant_slas` replaces the spec's tenants' SLAs for the autoscaling policy."""
    replicas = model.replicas
    options: dict[str, Any] = {
        "name": deployment_name(model.name),
        **replica_placement(model),  # ray_actor_options (+ placement group when TP x PP > 1)
        # the engine batches up to max_num_seqs and queues as many again; the ingress sends
        # no more than that per ready replica (admission/priority.py), the rest wait there in
        # deadline order; the router's own queue is bounded by max_queue_len (then 503)
        "max_ongoing_requests": replica_slots(model),
        "max_queued_requests": spec.server.max_queue_len,
        # a stuck engine fails check_health and is replaced; a stopping replica drains
        "health_check_period_s": replicas.health_check_period_s,
        "health_check_timeout_s": replicas.health_check_timeout_s,
        "graceful_shutdown_timeout_s": replicas.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": replicas.graceful_shutdown_wait_loop_s,
    }
    if (router := router_config(model)) is not None:
        options["request_router_config"] = router
    if replicas.min_replicas == replicas.max_replicas:
        options["num_replicas"] = replicas.max_replicas
    else:
        # the measured model, else on GPU the roofline prior (refit online from the
        # replicas' own time per output token: autoscale/step_refit.py)
        latency = policy_latency_model(model)
        if latency is None and spec.autoscaling.policy == "sla":
            log.warning(
                "model %s autoscales with the SLA policy but has no latency model (none "
                "measured, and no size known for a roofline prior): no capacity floor or "
                "burst detection, only reactive scaling from observed latencies; measure one "
                "with `agentserve bench fit-latency` and set models[].latency_model",
                model.name,
            )
        options["autoscaling_config"] = ray_autoscaling_config(
            spec,
            model.name,
            latency_model=latency,
            replica_start_s=expected_start_s(model),
            tenant_slas=tenant_slas,
            refit_online=latency is not None and is_roofline_prior(model),
        )
    return options


def router_config(model: ModelSpec) -> RequestRouterConfig | None:
    """Serve's request router for the model's replicas: session and prefix affinity
    (serve/affinity_router.py) when model.routing.affinity is on and the model may have
    more than one replica; None: Serve's default (power of two choices)."""
    if not model.routing.affinity or model.replicas.max_replicas < 2:
        return None
    kwargs = {"max_imbalance_requests": model.routing.imbalance_bound(model.engine_slots)}
    return RequestRouterConfig(request_router_class=ROUTER_PATH, request_router_kwargs=kwargs)


def expected_start_s(model: ModelSpec) -> float:
    """Expected replica start (the policy's warming credit), as the engine registered for
    model.engine declares it (e.g. vLLM on CPU compiles for 80-140 s)."""
    return engine_class(model.engine).expected_start_s(model)


def build_app(
    spec: DeploymentSpec,
    engine_factory: EngineFactory = default_engine_factory,
    *,
    tenant_slas: Mapping[str, SLASpec] | None = None,
) -> serve.Application:
    """The Serve application for `spec`; run it with serve.run(app, route_prefix="/").
    Model deployments with min_replicas < max_replicas autoscale with
    spec.autoscaling.policy: "sla" (our policy, fed by the replicas' autoscaling stats) or
    "ray_default" (Ray's target_ongoing_requests).

    Tenants never reach the model deployments or the ingress's init args: the ingress
    gets them as its user_config (agentserve.tenant_config). `tenant_slas` given: the
    spec has no tenants because a Serve config supplies that user_config (the operator's
    path, build_app_from_args)."""
    apart = bool(spec.tenants) or tenant_slas is not None
    if tenant_slas is None:
        tenant_slas = {t.name: t.sla for t in spec.tenants}
    look_back_s = spec.autoscaling.look_back_period_s
    models = {
        m.name: serve.deployment(ModelReplica)
        .options(**deployment_options(m, spec, tenant_slas))
        .bind(m, engine_factory, tracing=spec.tracing, window_s=look_back_s)
        for m in spec.models
    }
    ingress = serve.deployment(Ingress).options(**ingress_options(spec))
    if spec.tenants:
        ingress = ingress.options(user_config=ingress_user_config(spec))
    quota = None
    if ingress_replicas(spec) > 1:  # tenant limits shared by the ingress replicas
        max_age_s = spec.server.request_timeout_s + 60  # no request lives longer
        quota = serve.deployment(QuotaKeeper).options(**quota_options()).bind(max_age_s)
    bare = spec.model_copy(update={"tenants": []})
    return ingress.bind(bare, models, tenants_apart=apart, quota=quota)


def quota_options() -> dict[str, Any]:
    """Ray Serve options of the tenant-limits keeper: one replica, no CPU, and room for
    every call at once (each takes microseconds on its event loop)."""
    return {
        "name": QUOTA_NAME,
        "num_replicas": 1,
        "ray_actor_options": {"num_cpus": 0},
        "max_ongoing_requests": 10_000,
    }


def ingress_options(spec: DeploymentSpec) -> dict[str, Any]:
    """Ray Serve options of the ingress deployment (pure). It takes every request the
    models can hold or queue, plus spare for refusals and /health or /metrics: admission
    (503 + Retry-After beyond the queue) is the ingress's own, so Serve must not queue
    requests in front of it (its default, 5 at a time, throttled all streams to 5). It
    drains as long as the models do, since its streams wait on theirs."""
    capacity = sum(model_capacity(m, spec.server.max_queue_len) for m in spec.models)
    return {
        "name": INGRESS_NAME,
        "ray_actor_options": {"num_cpus": 0},
        "num_replicas": ingress_replicas(spec),
        "max_ongoing_requests": capacity + INGRESS_SPARE_REQUESTS,
        "graceful_shutdown_timeout_s": max(
            m.replicas.graceful_shutdown_timeout_s for m in spec.models
        ),
    }


def build_app_from_args(args: dict[str, Any]) -> serve.Application:
    """Ray Serve app builder for `serve run` / KubeRay serveConfigV2 (import_path
    `agentserve.serve.app:build_app_from_args`): args = tenant_config.app_args(spec) (the
    tenants then come as the ingress deployment's user_config), or {"spec": the whole
    DeploymentSpec as a dict}."""
    if "spec" not in args:
        raise ValueError('serve application args need a "spec" entry (the DeploymentSpec)')
    if args.get("tenants_from") == TENANTS_FROM_USER_CONFIG:
        spec, slas = spec_from_app_args(args)
        return build_app(spec, tenant_slas=slas)
    return build_app(spec_from_dict(args["spec"]))

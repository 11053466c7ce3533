"""Model replica: the Ray Serve deployment body for one model; the engine is injected.

Ray Serve calls `check_health` every health_check_period_s; raising there (or not
answering within health_check_timeout_s) three times in a row makes Serve replace the
replica, but gracefully: it stops checking and waits graceful_shutdown_timeout_s for the
in-flight requests, which a stuck engine never finishes. So the replica also watches its
engine itself (same period and timeout, whether Serve still checks or not) and exits
after three failed or late probes in a row. An engine that dies mid-request
(EngineDeadError) takes its replica down at once too. Either way the router stops sending
it requests, Serve starts a new one, and the ingress continues the cut requests
elsewhere (serve/migrate.py).
Serve calls `record_autoscaling_stats` every look_back_period_s / 5 when the deployment
autoscales: per-tenant TTFT/TPOT windows, arrivals, engine batch and queue, DFlash
acceptance by batch size and the replica's start time, construction to engine ready
(serve/replica_stats.py), which the SLA policy (autoscale/ray_policy.py) reads.
With replicas.sleep_when_idle_s (GPU), an idle replica's engine sleeps and its next request
wakes it first (serve/sleep_gate.py); the stats then say whether it sleeps and how long its
last wake took.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

from agentserve.engine.protocol import (
    Delta,
    Embeddings,
    EmbedRequest,
    Engine,
    EngineDeadError,
    EngineGoneError,
    EngineRequest,
    EngineStats,
    EngineUnavailableError,
    aclose_stream,
)
from agentserve.engine.registry import engine_class
from agentserve.serve.coalesce import coalesced, stream_interval_s
from agentserve.serve.replica_stats import ReplicaStats
from agentserve.serve.sleep_gate import SleepGate, sleep_gate
from agentserve.serve.spans import speculative_tokens, traced_stream
from agentserve.spec import ModelSpec, TracingSpec
from agentserve.tracing import close_tracer, make_tracer

__all__ = ["EngineFactory", "ModelReplica", "default_engine_factory"]

EngineFactory = Callable[[ModelSpec], Engine]
"""ModelSpec -> unstarted Engine. Must be picklable (it travels to Ray replicas)."""

log = logging.getLogger(__name__)
EXIT_DELAY_S = 0.2  # lets the EngineDeadError reach the ingress before the replica exits
HEALTH_FAILURES_TO_EXIT = 3  # Ray Serve's REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD
HEALTH_TIMEOUT_FRACTION = 0.8  # of health_check_timeout_s: answer before Serve gives up


def default_engine_factory(model: ModelSpec) -> Engine:
    """The engine registered as model.engine (agentserve.engine.registry), imported here,
    on the replica: only the engine a spec names is ever imported."""
    return engine_class(model.engine).from_model(model)


class ModelReplica:
    """One replica of one model: starts its engine, streams deltas, reports stats/health."""

    _streams = 0  # generate_batches calls open (their coalescing interval grows with it)

    async def __init__(
        self,
        model: ModelSpec,
        engine_factory: EngineFactory,
        tracing: TracingSpec | None = None,
        window_s: float = 30.0,
    ):
        constructed = time.monotonic()
        self.model = model
        self.engine = engine_factory(model)
        self.tracer = make_tracer(tracing or TracingSpec(), os.environ, "replica")
        self.speculative_tokens = speculative_tokens(self.engine, model)
        self.windows = ReplicaStats(window_s)
        self.health_failures = 0  # consecutive failed probes of the watchdog
        self.sleep_gate: SleepGate | None = None  # set once the engine is up
        _import_request_types()
        await self.engine.start()
        self.windows.start_s = time.monotonic() - constructed  # construction -> engine ready
        log.info("replica of %s ready in %.1f s", model.name, self.windows.start_s)
        self.sleep_gate = sleep_gate(self.engine, model.replicas.sleep_when_idle_s)
        if self.sleep_gate is not None:
            self.sleep_gate.arm()  # a standby replica may idle from its start
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_engine())

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Stream the engine's deltas (a Serve streaming method: call with stream=True)."""
        if getattr(self, "_exiting", False):  # routed here while the replica goes down
            raise EngineGoneError(f"the engine of {self.model.name} died before this request")
        stream = traced_stream(  # spans: queue wait, replica, prefill, decode
            self.tracer,
            request,
            self.engine.generate(request),
            model=self.model.name,
            num_speculative_tokens=self.speculative_tokens,
            proposer_counts=getattr(self.engine, "proposer_counts", None),  # hybrid drafting
        )
        self.windows.begin(request.request_id, request.headers)  # a wake counts in TTFT
        awake = self.sleep_gate.serving() if self.sleep_gate else contextlib.nullcontext()
        try:
            async with awake:
                async for delta in stream:
                    self.windows.see(request.request_id, delta)
                    yield delta
        except EngineDeadError:
            self._exit_soon()
            raise
        finally:
            self.windows.end(request.request_id)
            await aclose_stream(stream)  # a cancelled handle call lands here: the engine aborts

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """The engine's embeddings of `request` (an embedding model's replica), waking a
        sleeping engine first; a dead engine takes the replica down as in generate."""
        if getattr(self, "_exiting", False):
            raise EngineGoneError(f"the engine of {self.model.name} died before this request")
        awake = self.sleep_gate.serving() if self.sleep_gate else contextlib.nullcontext()
        try:
            async with awake:
                return await self.engine.embed(request)
        except EngineDeadError:
            self._exit_soon()
            raise

    async def generate_batches(self, request: EngineRequest) -> AsyncIterator[list[Delta]]:
        """`generate` as the ingress receives it (a Serve streaming method): the first
        delta at once, then one message per interval with every delta since the last,
        merged (serve/coalesce.py): model.stream_interval_ms per stream open here, at
        most model.stream_interval_max_ms. Fewer wake-ups per token on the replica ->
        ingress -> proxy path, which the engine's threads share."""
        model = self.model

        def interval_s() -> float:  # longer while more streams share the replica
            return stream_interval_s(
                model.stream_interval_ms, model.stream_interval_max_ms, self._streams
            )

        self._streams += 1
        try:
            async for batch in coalesced(self.generate(request), interval_s):
                yield batch
        finally:
            self._streams -= 1

    async def stats(self) -> EngineStats:
        return await self.engine.stats()

    async def health(self) -> None:
        await self.engine.health()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve's custom autoscaling metrics hook (flat name -> float)."""
        sleep = self.sleep_gate.state() if self.sleep_gate else None
        return self.windows.autoscaling_stats(await self.engine.stats(), sleep)

    async def check_health(self) -> None:
        """Ray Serve's health hook: raise when the engine cannot serve or does not say so
        within HEALTH_TIMEOUT_FRACTION of health_check_timeout_s."""
        await self._probe()

    async def _probe(self) -> None:
        timeout_s = HEALTH_TIMEOUT_FRACTION * self.model.replicas.health_check_timeout_s
        try:
            await asyncio.wait_for(self.engine.health(), timeout_s)
        except Exception as err:  # failed or late: both mean "cannot serve"
            raise EngineUnavailableError(f"engine of {self.model.name} unhealthy: {err!r}") from err

    async def _watch_engine(self) -> None:
        """Probe the engine every health_check_period_s; exit after
        HEALTH_FAILURES_TO_EXIT failed probes in a row (see module docstring)."""
        while True:
            await asyncio.sleep(self.model.replicas.health_check_period_s)
            try:
                await self._probe()
            except EngineUnavailableError as err:
                self.health_failures += 1
                log.warning("probe %d: %s", self.health_failures, err)
                if self.health_failures >= HEALTH_FAILURES_TO_EXIT:
                    self._exit_soon()
                    return
            else:
                self.health_failures = 0

    def _exit_soon(self) -> None:
        """Kill this replica's actor shortly (once): its engine is dead."""
        if getattr(self, "_exiting", False):
            return
        self._exiting = True
        log.error("engine of %s is dead or stuck; exiting the replica", self.model.name)
        asyncio.get_running_loop().call_later(EXIT_DELAY_S, _kill_this_actor)

    async def __del__(self) -> None:
        # __init__ may have stopped early (the engine factory or engine.start() raised):
        # stop what exists, so a half-started engine's processes are released too
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:
            watchdog.cancel()
        gate = getattr(self, "sleep_gate", None)
        if gate is not None:
            gate.close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            await engine.stop()
        tracer = getattr(self, "tracer", None)
        if tracer is not None:
            await asyncio.to_thread(close_tracer, tracer)


def _kill_this_actor() -> None:
    import ray

    _kill_child_processes()
    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


def _kill_child_processes() -> None:
    """SIGKILL this process's descendants (vLLM's engine core): a hung or stopped one
    would outlive the actor and keep its memory; SIGKILL works on a stopped process."""
    try:
        import psutil  # a vLLM dependency; an engine without child processes needs none
    except ImportError:
        return
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # already gone
            child.kill()


def _import_request_types() -> None:
    """Import the classes of the request bodies (vLLM's protocol models) while the replica
    starts, not when the first request is unpickled: those imports (vLLM, torch) took
    seconds on the event loop, which stalled every stream and made the replica's own
    health probes fail (an engine that does not import vLLM itself, like the fake one,
    left them to the first request)."""
    import agentserve.api.openai  # noqa: F401  (lazy on purpose: vLLM, torch; see above)

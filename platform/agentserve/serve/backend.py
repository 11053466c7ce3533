"""ModelBackend: what the ingress needs from one served model, and the in-process adapter.

The ingress talks to a ModelBackend, never to Ray: LocalBackend wraps an Engine in the
same process (unit tests, bare benchmarks); agentserve.serve.app.HandleBackend wraps a
Ray Serve deployment handle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from opentelemetry.trace import Tracer

from agentserve.engine.protocol import (
    Delta,
    Embeddings,
    EmbedRequest,
    Engine,
    EngineRequest,
    EngineStats,
    EngineUnavailableError,
)
from agentserve.serve.spans import speculative_tokens, traced_stream

__all__ = ["LocalBackend", "ModelBackend"]


class ModelBackend(Protocol):
    """One model as the ingress sees it; same error contract as Engine.generate."""

    def generate(self, request: EngineRequest) -> AsyncIterator[Delta]: ...

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """Engine.embed on one replica; same error contract."""
        ...

    async def stats(self) -> EngineStats: ...

    async def health(self) -> None: ...

    async def ready_replicas(self) -> int | None:
        """Replicas able to serve now (0 while scaled to zero or starting); None = unknown."""
        ...


class LocalBackend:
    """A started Engine in this process; with a `tracer`, each request records the same
    queue-wait/replica/prefill/decode spans as a Ray replica (serve/spans.py)."""

    def __init__(self, engine: Engine, tracer: Tracer | None = None):
        self.engine = engine
        self.tracer = tracer

    def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        stream = self.engine.generate(request)
        if self.tracer is None:
            return stream
        k = speculative_tokens(self.engine)
        return traced_stream(
            self.tracer,
            request,
            stream,
            model=self.engine.model_name,
            num_speculative_tokens=k,
            proposer_counts=getattr(self.engine, "proposer_counts", None),  # hybrid drafting
        )

    async def embed(self, request: EmbedRequest) -> Embeddings:
        return await self.engine.embed(request)

    async def stats(self) -> EngineStats:
        return await self.engine.stats()

    async def health(self) -> None:
        await self.engine.health()

    async def ready_replicas(self) -> int | None:
        """1 while the engine is healthy, else 0."""
        try:
            await self.engine.health()
        except EngineUnavailableError:
            return 0
        return 1

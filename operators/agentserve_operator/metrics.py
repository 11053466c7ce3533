"""Operator Prometheus metrics (own registry, served on the metrics port) and a reconcile timer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

__all__ = ["OperatorMetrics"]


class OperatorMetrics:
    """Reconcile counts by outcome, durations, and actions applied by verb and kind."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(
            "agentserve_operator_reconciles_total",
            "Reconciles by outcome (ok, invalid, retry, error).",
            ["outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "agentserve_operator_reconcile_seconds",
            "Reconcile wall time.",
            registry=self.registry,
        )
        self.actions = Counter(
            "agentserve_operator_actions_total",
            "Child object writes by verb, kind and reason.",
            ["verb", "kind", "reason"],
            registry=self.registry,
        )

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Observe the duration of the enclosed reconcile."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.duration.observe(time.perf_counter() - start)

    def serve(self, port: int) -> None:
        """Expose /metrics on `port` (a daemon thread)."""
        start_http_server(port, registry=self.registry)

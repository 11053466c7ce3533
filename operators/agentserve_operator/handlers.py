"""kopf registration only: AgentServe events and an operator-wide drift resync delegate to
reconcile().

Run: `kopf run -m agentserve_operator.handlers --all-namespaces --liveness=http://0.0.0.0:8080/healthz`.
Invalid specs -> kopf.PermanentError (status + Event written by reconcile); API failures ->
kopf.TemporaryError (kopf retries with the given delay). No handler here needs a finalizer:
no deletion handler, no kopf timer or daemon (kopf finalizes objects that have one, and a
CR would then outlive an uninstalled operator, Terminating for ever); drift is repaired by
resync.py's loop over kopf's index, and children are deleted by Kubernetes' garbage collector
through owner references. A finalizer left by an older operator is removed by kopf on the
first event it handles for that CR.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
import os
from typing import Any

import kopf

from agentserve_operator import kuberay as kr
from agentserve_operator import resource as r
from agentserve_operator.metrics import OperatorMetrics
from agentserve_operator.reconcile import (
    Cluster,
    ClusterError,
    ReconcileResult,
    RetriableClusterError,
    reconcile,
)
from agentserve_operator.resync import indexed_bodies, resync_forever
from agentserve_operator.serve_probe import fetch_status

__all__ = ["run_reconcile"]

DRIFT_INTERVAL_S = float(os.environ.get("AGENTSERVE_OPERATOR_RESYNC_S", "30"))
RETRY_DELAY_S = 15.0
FORBIDDEN_RETRY_DELAY_S = 120.0


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_reconcile(cluster: Cluster, metrics: OperatorMetrics, body: Any,
                  logger: logging.Logger | logging.LoggerAdapter,
                  kuberay: kr.Detector | None = None) -> ReconcileResult:  # fmt: skip
    """Reconcile one CR body, counting outcomes; API failures -> kopf.TemporaryError."""
    with metrics.timed():
        try:
            result = reconcile(cluster, _plain(body), _now(), kuberay, fetch_status)
        except RetriableClusterError as err:
            metrics.reconciles.labels("retry").inc()
            raise kopf.TemporaryError(str(err), delay=RETRY_DELAY_S) from err
        except ClusterError as err:  # e.g. RBAC: retry slowly, an admin may fix it
            metrics.reconciles.labels("error").inc()
            raise kopf.TemporaryError(str(err), delay=FORBIDDEN_RETRY_DELAY_S) from err
    for action in result.actions:
        metrics.actions.labels(action.verb, action.ref.kind, action.reason).inc()
        logger.info("%s %s/%s (%s)", action.verb, action.ref.kind, action.ref.name, action.reason)
    metrics.reconciles.labels("invalid" if result.error else "ok").inc()
    return result


def _plain(body: Any) -> dict[str, Any]:
    """kopf's Body (or any mapping) -> a plain, independent dict."""
    return copy.deepcopy(dict(body))


@kopf.index(r.GROUP, r.VERSION, r.PLURAL)
def agentserves(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Every AgentServe kopf sees, by (namespace, name): the resync loop's work list."""
    return {(namespace, name): _plain(body)}


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, agentserves: kopf.Index,
                   logger: Any, **_: Any) -> None:  # fmt: skip
    from agentserve_operator.k8s import KubeCluster  # lazy: the kubernetes client (heavy)

    settings.posting.level = logging.WARNING  # kopf's own Events: problems only
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=r.GROUP, key="last-handled-configuration"
    )
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=r.GROUP)
    memo.cluster = KubeCluster()
    memo.kuberay = kr.Detector(memo.cluster.read_crd)  # shared: the CRD read once per TTL
    try:
        logger.info("KubeRay %s detected", memo.kuberay.installed().version)
    except kr.UnsupportedKubeRay as err:
        logger.warning("%s", err)
    except ClusterError as err:  # retried by the first reconcile
        logger.warning("KubeRay not detected yet: %s", err)
    memo.metrics = OperatorMetrics()
    memo.metrics.serve(int(os.environ.get("AGENTSERVE_OPERATOR_METRICS_PORT", "9090")))
    index = agentserves  # kopf fills it from its watch; safe to read from a task
    memo.resync_task = asyncio.create_task(resync_forever(
        lambda: indexed_bodies(index),
        lambda body: _resync(body=body, memo=memo, logger=logger),
        DRIFT_INTERVAL_S, logger,
    ))  # fmt: skip


@kopf.on.cleanup()
async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "resync_task", None)
    if task is not None:
        task.cancel()


@kopf.on.probe(id="reconciles")
def _probe(memo: kopf.Memo, **_: Any) -> float:
    return sum(s.value for m in memo.metrics.reconciles.collect() for s in m.samples
               if s.name.endswith("_total"))  # fmt: skip


@kopf.on.create(r.GROUP, r.VERSION, r.PLURAL)
@kopf.on.update(r.GROUP, r.VERSION, r.PLURAL)
@kopf.on.resume(r.GROUP, r.VERSION, r.PLURAL)
def _on_change(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    result = run_reconcile(memo.cluster, memo.metrics, body, logger, getattr(memo, "kuberay", None))
    if result.error is not None:
        raise kopf.PermanentError(str(result.error))


def _resync(body: Any, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    """Level-based resync of one CR: recreates deleted children, reverts edits, refreshes
    status. Called by resync.py's loop (not a kopf timer: see the module docstring)."""
    result = run_reconcile(memo.cluster, memo.metrics, body, logger, getattr(memo, "kuberay", None))
    if result.error is not None:
        logger.warning("invalid spec: %s", result.error)

"""Uninstall leaves nothing behind (issue 28 item 4).

An AgentServe must stay deletable once the operator is gone (`helm uninstall` removes the
operator before its CRs): no handler may make kopf put its finalizer on the CR. Asked of
kopf's own registry with the very checks kopf's reactor makes before adding a finalizer.
Drift is still repaired, by the operator-wide resync loop (resync.py), tested here too.
"""

from __future__ import annotations

import asyncio
import copy
import logging

import kopf
import pytest
from agentserve_operator import resource as r
from agentserve_operator.fake import FakeCluster
from agentserve_operator.metrics import OperatorMetrics
from agentserve_operator.resync import indexed_bodies, resync_once
from kopf._cogs.structs import patches
from kopf._core.intents import causes
from operator_cases import GPU_CR, MODELS_PVC, SECRET

LOG = logging.getLogger("test")


def _stored_cr() -> kopf.Body:
    raw = copy.deepcopy(GPU_CR)
    raw["metadata"].update(uid="uid-1", generation=1, resourceVersion="1")
    return kopf.Body(raw)


def finalizer_required(registry: kopf.OperatorRegistry, body: kopf.Body) -> list[str]:
    """Why kopf would finalize `body`: the registries that say so (as kopf's
    process_resource_causes asks them: spawning for daemons/timers, changing for on.delete)."""
    common = dict(logger=LOG, indices={}, memo=kopf.Memo(), patch=patches.Patch(), body=body,
                  resource=kopf.Resource(r.GROUP, r.VERSION, r.PLURAL))  # fmt: skip
    spawning = causes.SpawningCause(reset=False, **common)
    changing = causes.ChangingCause(initial=False, reason=causes.Reason.CREATE, **common)
    reasons = []
    if registry._spawning.requires_finalizer(cause=spawning):
        reasons.append("daemon or timer")
    if registry._changing.requires_finalizer(cause=changing):
        reasons.append("mandatory deletion handler")
    return reasons


def test_no_handler_makes_kopf_finalize_an_agentserve():
    from agentserve_operator import handlers

    registry = kopf.get_default_registry()
    ours = [h for reg in (registry._spawning, registry._changing) for h in reg.get_all_handlers()
            if h.fn.__module__ == handlers.__name__]  # fmt: skip
    assert ours, "the handlers module registered nothing"
    assert finalizer_required(registry, _stored_cr()) == []


def test_the_check_sees_a_timer_finalizer():
    """The check above can fail: a kopf timer (what the operator used before) needs one."""
    registry = kopf.OperatorRegistry()
    kopf.timer(r.GROUP, r.VERSION, r.PLURAL, interval=30, registry=registry)(lambda **_: None)
    assert finalizer_required(registry, _stored_cr()) == ["daemon or timer"]


def test_drift_resync_is_an_index_not_a_per_object_timer():
    from agentserve_operator import handlers

    registry = kopf.get_default_registry()
    indexers = [h.fn for h in registry._indexing.get_all_handlers()]
    assert handlers.agentserves in indexers
    timers = [h for h in registry._spawning.get_all_handlers()
              if h.fn.__module__ == handlers.__name__]  # fmt: skip
    assert timers == []


# -- the resync loop --------------------------------------------------------------------


def _cluster() -> FakeCluster:
    fake = FakeCluster()
    fake.put(SECRET)
    fake.put(MODELS_PVC)
    fake.put(GPU_CR)
    return fake


def _reconcile_with(cluster: FakeCluster):
    from agentserve_operator import handlers

    memo = kopf.Memo(cluster=cluster, metrics=OperatorMetrics())
    return lambda body: handlers._resync(body=body, memo=memo, logger=LOG)


def test_resync_recreates_a_deleted_child_and_skips_a_cr_being_deleted():
    from agentserve_operator.plan import ObjectRef

    cluster = _cluster()
    reconcile_one = _reconcile_with(cluster)
    body = cluster.find("AgentServe", "demo")
    assert asyncio.run(resync_once([body], reconcile_one, LOG)) == 1
    rayservice = cluster.find("RayService", "demo")
    assert rayservice is not None
    cluster.delete(ObjectRef.of(rayservice))  # someone deletes the child: drift
    assert asyncio.run(resync_once([body], reconcile_one, LOG)) == 1
    assert cluster.find("RayService", "demo") is not None
    cluster.delete(ObjectRef.of(cluster.find("RayService", "demo")))
    going = copy.deepcopy(body)
    going["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    assert asyncio.run(resync_once([going], reconcile_one, LOG)) == 0
    assert cluster.find("RayService", "demo") is None  # nothing recreated for a leaving CR


def test_resync_failure_of_one_cr_does_not_stop_the_others(caplog):
    cluster = _cluster()
    other = copy.deepcopy(GPU_CR)
    other["metadata"]["name"] = "other"
    cluster.put(other)
    cluster.failures.append("apply")  # the first CR's first write fails
    bodies = [cluster.find("AgentServe", "demo"), cluster.find("AgentServe", "other")]
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(resync_once(bodies, _reconcile_with(cluster), LOG)) == 1
    assert "resync of default/demo failed" in caplog.text
    assert cluster.find("RayService", "other") is not None


@pytest.mark.parametrize(
    ("index", "names"),
    [
        ({}, []),
        ({("a", "x"): [{"metadata": {"name": "x"}}]}, ["x"]),
        (
            {("a", "x"): [{"metadata": {"name": "x"}}], ("b", "y"): [{"metadata": {"name": "y"}}]},
            ["x", "y"],
        ),
        ({("a", "x"): []}, []),
    ],
)
def test_indexed_bodies_flattens_kopf_stores(index, names):
    assert [b["metadata"]["name"] for b in indexed_bodies(index)] == names


def test_startup_runs_the_resync_loop_until_cleanup(monkeypatch):
    """The operator's start-up starts the loop over kopf's index; cleanup stops it."""
    from agentserve_operator import handlers, k8s

    cluster = _cluster()
    monkeypatch.setattr(k8s, "KubeCluster", lambda: cluster)
    monkeypatch.setattr(OperatorMetrics, "serve", lambda self, port: None)
    monkeypatch.setattr(handlers, "DRIFT_INTERVAL_S", 0.01)
    index = {("default", "demo"): [cluster.find("AgentServe", "demo")]}

    async def run() -> bool:
        memo = kopf.Memo()
        await handlers._startup(settings=kopf.OperatorSettings(), memo=memo, agentserves=index,
                                logger=LOG)  # fmt: skip
        for _ in range(200):
            if cluster.find("RayService", "demo") is not None:
                break
            await asyncio.sleep(0.01)
        await handlers._cleanup(memo=memo)
        await asyncio.sleep(0)
        return memo.resync_task.cancelled() or memo.resync_task.done()

    assert asyncio.run(run())
    assert cluster.find("RayService", "demo") is not None

"""Drift resync of every AgentServe the operator sees, without a finalizer on any of them.

kopf's per-object timers and daemons always put a finalizer on their objects (kopf needs it
to stop them before the object goes). A finalizer outliving the operator (`helm uninstall`
removes the operator before its AgentServes) leaves the CR Terminating for ever and its
RayService and GPU pods never collected. So drift is repaired by one operator-wide loop
instead: every `interval_s` it reconciles each AgentServe of kopf's index (which kopf keeps
from its watch, and which needs no finalizer); children are deleted by Kubernetes' garbage
collector through their owner references.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["indexed_bodies", "resync_forever", "resync_once"]

Body = Mapping[str, Any]


def indexed_bodies(index: Mapping[Any, Iterable[Body]]) -> list[Body]:
    """The bodies held in a kopf index ({key: store of values}), copied out as a list."""
    return [body for key in list(index) for body in list(index.get(key) or ())]


def _being_deleted(body: Body) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


async def resync_once(bodies: Iterable[Body], reconcile_one: Callable[[Body], Any],
                      logger: logging.Logger | logging.LoggerAdapter) -> int:  # fmt: skip
    """Reconcile each body in a worker thread, one at a time; return how many succeeded.

    Bodies being deleted are skipped (the garbage collector owns their children now). A
    failure is logged and does not stop the others: this is a top-level loop.
    """
    done = 0
    for body in bodies:
        if _being_deleted(body):
            continue
        meta = body.get("metadata") or {}
        try:
            await asyncio.to_thread(reconcile_one, body)
            done += 1
        except Exception as err:  # top-level loop: log it, go on with the next CR
            logger.warning("resync of %s/%s failed: %s",
                           meta.get("namespace"), meta.get("name"), err)  # fmt: skip
    return done


async def resync_forever(snapshot: Callable[[], Iterable[Body]],
                         reconcile_one: Callable[[Body], Any], interval_s: float,
                         logger: logging.Logger | logging.LoggerAdapter) -> None:  # fmt: skip
    """Every `interval_s`: resync_once over a fresh `snapshot()`. Runs until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        await resync_once(snapshot(), reconcile_one, logger)

"""In-memory Kubernetes API for tests: the Cluster port over a dict of objects.

It records every call, assigns uids and resourceVersions, applies like server-side apply
(the applied object's fields replace the stored ones; fields set by others stay), and
garbage-collects children through owner references when an owner is deleted.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from agentserve_operator import resource as r
from agentserve_operator.plan import ObjectRef
from agentserve_operator.reconcile import RetriableClusterError

__all__ = ["FakeCluster"]


def _merge(stored: Any, applied: Any) -> Any:
    """Server-side-apply-like merge: applied mappings merge key-wise, anything else wins."""
    if isinstance(stored, dict) and isinstance(applied, dict):
        out = dict(stored)
        for key, value in applied.items():
            out[key] = _merge(stored.get(key), value)
        return out
    return copy.deepcopy(applied)


class FakeCluster:
    """A fake API server holding objects by ObjectRef; `calls` logs (verb, detail)."""

    def __init__(self, *, crds: set[str] | None = None,
                 crd_bodies: dict[str, dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.objects: dict[ObjectRef, dict[str, Any]] = {}
        self.crd_bodies = dict(crd_bodies or {})  # name -> CRD object (read_crd)
        self.crds = set(crds or ()) | set(self.crd_bodies)
        self.calls: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.failures: list[str] = []  # verbs that raise RetriableClusterError once each
        self._ids = itertools.count(1)

    # -- helpers for tests -------------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as a user would create it (kubectl apply)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", f"uid-{next(self._ids)}")
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._ids))
        self.objects[ObjectRef.of(obj)] = obj
        return obj

    def find(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """The stored object of `kind` named `name`, if any."""
        for ref, obj in self.objects.items():
            if (ref.kind, ref.name, ref.namespace) == (kind, name, namespace):
                return obj
        return None

    def kinds(self) -> list[str]:
        """Sorted kinds of all stored objects."""
        return sorted(ref.kind for ref in self.objects)

    def _maybe_fail(self, verb: str) -> None:
        if verb in self.failures:
            self.failures.remove(verb)
            raise RetriableClusterError(f"fake: {verb} unavailable (503)")

    # -- the Cluster port --------------------------------------------------------------
    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        self.calls.append(("get", f"{ref.kind}/{ref.name}"))
        self._maybe_fail("get")
        obj = self.objects.get(ref)
        return copy.deepcopy(obj) if obj is not None else None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(obj)
        self.calls.append(("apply", f"{ref.kind}/{ref.name}"))
        self._maybe_fail("apply")
        current = self.objects.get(ref)
        if current is None:
            return copy.deepcopy(self.put(obj))
        merged = _merge(current, obj)
        merged["metadata"]["resourceVersion"] = str(next(self._ids))
        self.objects[ref] = merged
        return copy.deepcopy(merged)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(obj)
        self.calls.append(("create", f"{ref.kind}/{ref.name}"))
        self._maybe_fail("create")
        if ref in self.objects:
            raise RetriableClusterError(f"fake: {ref.kind}/{ref.name} already exists (409)")
        return copy.deepcopy(self.put(obj))

    def delete(self, ref: ObjectRef) -> None:
        self.calls.append(("delete", f"{ref.kind}/{ref.name}"))
        self._maybe_fail("delete")
        obj = self.objects.pop(ref, None)
        if obj is not None:
            self._collect_garbage(obj["metadata"]["uid"])

    def _collect_garbage(self, owner_uid: str) -> None:
        for ref, obj in list(self.objects.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == owner_uid for o in owners):
                self.delete(ref)

    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        self.calls.append(("list", "Pod"))
        return [
            copy.deepcopy(obj)
            for ref, obj in self.objects.items()
            if ref.kind == "Pod"
            and ref.namespace == namespace
            and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
        ]

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        self.calls.append(("get", f"Secret/{name}"))
        obj = self.find("Secret", name, namespace)
        if obj is None:
            return None
        return {**r.secret_text(name, obj.get("data")), **(obj.get("stringData") or {})}

    def crd_exists(self, name: str) -> bool:
        return name in self.crds

    def read_crd(self, name: str) -> dict[str, Any] | None:
        body = self.crd_bodies.get(name)
        return copy.deepcopy(body) if body is not None else None

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.calls.append(("patch-status", name))
        self._maybe_fail("patch-status")
        obj = self.find("AgentServe", name, namespace)
        if obj is not None:
            obj["status"] = _merge(obj.get("status") or {}, status)

    def post_event(self, cr: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason))
        self.events.append((kind, reason, message))

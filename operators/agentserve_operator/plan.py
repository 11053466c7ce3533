"""Pure reconcile decisions: plan(desired, observed) -> the actions that make observed match.

An object is in sync when everything the operator sets is present and equal in the observed
copy (`contains`): fields the API server or other controllers add (defaults, status, the
autoscaler's `replicas`) never count as drift. Only objects owned by this CR are deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Action", "ObjectRef", "contains", "plan"]


@dataclass(frozen=True)
class ObjectRef:
    """Identity of a namespaced object: apiVersion, kind, namespace, name."""

    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectRef:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


@dataclass(frozen=True)
class Action:
    """`apply` a whole object (server-side apply) or `delete` one; `reason` says why."""

    verb: Literal["apply", "delete"]
    ref: ObjectRef
    reason: Literal["missing", "drift", "stale"]
    obj: dict[str, Any] | None = None


def contains(observed: Any, desired: Any) -> bool:
    """True when `observed` has every field of `desired` with an equal value.

    Mappings: each desired key present and contained; lists: same length, item-wise
    contained; numbers compare by value (1 == 1.0); anything else by equality.
    """
    if isinstance(desired, dict):
        return isinstance(observed, dict) and all(
            k in observed and contains(observed[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(observed, list)
            and len(observed) == len(desired)
            and all(contains(o, d) for o, d in zip(observed, desired, strict=True))
        )
    return observed == desired


def _owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid for ref in refs)


def plan(
    desired: list[dict[str, Any]],
    observed: dict[ObjectRef, dict[str, Any]],
    owner_uid: str,
) -> list[Action]:
    """Actions (in `desired` order, deletions last) that bring `observed` to `desired`.

    `observed` holds the current copy of each child the CR may have (absent = not found);
    a child not desired any more is deleted only when `owner_uid` owns it. Applying the
    returned actions and planning again yields [].
    """
    actions = []
    for obj in desired:
        ref = ObjectRef.of(obj)
        current = observed.get(ref)
        if current is None:
            actions.append(Action("apply", ref, "missing", obj))
        elif not contains(current, obj):
            actions.append(Action("apply", ref, "drift", obj))
    wanted = {ObjectRef.of(obj) for obj in desired}
    actions += [
        Action("delete", ref, "stale")
        for ref, obj in observed.items()
        if ref not in wanted and _owned_by(obj, owner_uid)
    ]
    return actions

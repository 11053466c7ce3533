"""plan(desired, observed) as an input -> output table, and the `contains` drift rule."""

from __future__ import annotations

import copy

import pytest
from agentserve_operator.plan import Action, ObjectRef, contains, plan

UID = "owner-uid"


def obj(kind, name, **spec):
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "ownerReferences": [{"uid": UID}]},
        "spec": spec,
    }


CM = obj("ConfigMap", "a-spec", x=1)
SVC = obj("Service", "a-openai", port=8000)
MON = obj("ServiceMonitor", "a", path="/metrics")


def server_copy(o, **extra_spec):
    """What the API returns: the object plus defaulted fields."""
    out = copy.deepcopy(o)
    out["metadata"]["resourceVersion"] = "7"
    out["spec"].update(extra_spec)
    out["status"] = {"ok": True}
    return out


def ref(o):
    return ObjectRef.of(o)


def verbs(actions):
    return [(a.verb, a.ref.kind, a.reason) for a in actions]


@pytest.mark.parametrize(
    ("name", "desired", "observed", "expected"),
    [
        ("fresh CR: create all", [CM, SVC], {}, [("apply", "ConfigMap", "missing"),
                                                 ("apply", "Service", "missing")]),
        ("in sync (server defaults ignored)", [CM, SVC],
         {ref(CM): server_copy(CM, sessionAffinity="None"), ref(SVC): server_copy(SVC)}, []),
        ("child deleted: recreate", [CM, SVC], {ref(CM): server_copy(CM)},
         [("apply", "Service", "missing")]),
        ("managed field edited: revert", [CM, SVC],
         {ref(CM): server_copy(CM, x=2), ref(SVC): server_copy(SVC)},
         [("apply", "ConfigMap", "drift")]),
        ("monitoring off: delete owned ServiceMonitor", [CM],
         {ref(CM): server_copy(CM), ref(MON): server_copy(MON)},
         [("delete", "ServiceMonitor", "stale")]),
    ],
)  # fmt: skip
def test_plan_table(name, desired, observed, expected):
    assert verbs(plan(desired, observed, UID)) == expected, name


def test_foreign_object_is_never_deleted():
    foreign = server_copy(MON)
    foreign["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    assert plan([CM], {ref(CM): server_copy(CM), ref(MON): foreign}, UID) == []


def test_apply_actions_carry_the_full_object():
    [action] = plan([CM], {}, UID)
    assert action == Action("apply", ref(CM), "missing", CM)


@pytest.mark.parametrize(
    ("observed", "desired", "expected"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": [1, 2]}, {"a": [1, 2]}, True),
        ({"a": [1, 2, 3]}, {"a": [1, 2]}, False),
        ({"a": [{"x": 1, "y": 2}]}, {"a": [{"x": 1}]}, True),
        ({"n": 2}, {"n": 2.0}, True),
        ({"s": "2"}, {"s": 2}, False),
    ],
)
def test_contains_table(observed, desired, expected):
    assert contains(observed, desired) is expected

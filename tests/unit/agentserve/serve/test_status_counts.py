"""Replica counts from the Serve controller's raw instance details (serve/status.py)."""

from __future__ import annotations

import enum

import pytest
from agentserve.serve import status as status_module
from agentserve.serve.status import replica_states, states_from_details


class State(enum.Enum):  # Ray sends its ReplicaState enum inside the dict
    RUNNING = "RUNNING"
    STARTING = "STARTING"


def _details(replicas: list) -> dict:
    deployments = {"model-x": {"replicas": replicas}, "ingress": {}}
    return {"applications": {"agentserve": {"deployments": deployments}}}


def test_states_are_counted_per_state_from_enums_or_strings():
    details = _details([{"state": State.RUNNING}, {"state": "RUNNING"}, {"state": State.STARTING}])
    assert states_from_details(details, "agentserve", "model-x") == {"RUNNING": 2, "STARTING": 1}
    assert states_from_details(details, "agentserve", "ingress") == {}


def test_an_unknown_deployment_is_a_key_error():
    with pytest.raises(KeyError):
        states_from_details(_details([]), "agentserve", "model-y")


def test_without_a_serve_client_the_public_status_is_read(monkeypatch):
    import ray.serve.context as context

    monkeypatch.setattr(context, "_get_global_client", lambda **_: None)
    public = {"applications": {"a": {"deployments": {"d": {"replicas": {"RUNNING": 3}}}}}}
    monkeypatch.setattr(status_module, "current_status", lambda: public)
    assert replica_states("a", "d") == {"RUNNING": 3}

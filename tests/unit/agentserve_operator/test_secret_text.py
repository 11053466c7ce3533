"""A Secret value that is not UTF-8 text (issue 30 item 12): the operator reports it in the
AgentServe's status and an Event, naming the Secret and key; it never crashes a handler."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest
from agentserve_operator.k8s import KubeCluster
from agentserve_operator.reconcile import reconcile
from agentserve_operator.resource import InvalidResource, secret_text
from test_reconcile import T0, conditions, conditions_message, cr

BINARY = base64.b64encode(b"\xff\xfe\x00key").decode()
TEXT = base64.b64encode("sk-älice".encode()).decode()


class _Core:
    """CoreV1Api.read_namespaced_secret returning one Secret's base64 `data`."""

    def __init__(self, data):
        self.data = data

    def read_namespaced_secret(self, name, namespace):
        return SimpleNamespace(data=self.data)


def _kube(data) -> KubeCluster:
    kube = object.__new__(KubeCluster)  # no API server: only `core` is used
    kube.core = _Core(data)
    return kube


def test_kube_cluster_decodes_text_and_refuses_binary_values():
    assert _kube({"alice": TEXT}).read_secret("ns", "keys") == {"alice": "sk-älice"}
    assert _kube(None).read_secret("ns", "keys") == {}
    with pytest.raises(InvalidResource, match=r"Secret 'keys': the value of key 'bob' is not"):
        _kube({"alice": TEXT, "bob": BINARY}).read_secret("ns", "keys")


def test_secret_text_refuses_what_is_not_base64():
    with pytest.raises(InvalidResource, match="key 'x'"):
        secret_text("keys", {"x": "not base64!"})


def test_binary_key_in_the_api_key_secret_is_an_invalid_spec(cluster):
    secret = cluster.find("Secret", "demo-keys", "default")
    secret.pop("stringData")
    secret["data"] = {"alice": BINARY}
    result = reconcile(cluster, cr(cluster), T0)
    assert isinstance(result.error, InvalidResource) and result.actions == []
    assert conditions(cluster)["Degraded"] == ("True", "InvalidSpec")
    message = "Secret 'demo-keys': the value of key 'alice' is not UTF-8"
    assert message in conditions_message(cluster)
    assert [e[1] for e in cluster.events] == ["InvalidSpec"]

"""`agentserve up`'s local Ray: token auth pinned on and every Ray address on loopback."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from agentserve.serve import app as serve_app  # noqa: E402
from agentserve.serve import local  # noqa: E402
from agentserve.spec import DeploymentSpec  # noqa: E402
from ray import serve  # noqa: E402


def test_start_local_pins_token_auth_and_binds_ray_to_loopback(monkeypatch):
    calls = {}
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a stray setting does not win
    monkeypatch.setattr(ray, "init", lambda **kw: calls.setdefault("init", kw))
    monkeypatch.setattr(serve, "start", lambda **kw: calls.setdefault("start", kw))
    monkeypatch.setattr(serve, "run_many", lambda targets, **kw: calls.setdefault("run", kw))
    monkeypatch.setattr(serve_app, "build_app", lambda spec, factory: "app")
    local.start_local(DeploymentSpec())
    import os

    assert os.environ["RAY_AUTH_MODE"] == "token"
    init = calls["init"]
    assert init["_node_ip_address"] == "127.0.0.1"
    assert init["include_dashboard"] is False and init["address"] == "local"
    assert calls["start"]["http_options"]["host"] == "127.0.0.1"  # the spec's server.host

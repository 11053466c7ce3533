"""Admin endpoints off the public port: /metrics and /status answer loopback clients only
on the API port, or only on server.metrics_port when it is set (serve/admin.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest
from agentserve.cli.status import fetch_report
from agentserve.cli.up import admin_url
from agentserve.serve import admin
from agentserve.serve.admin import AdminGate, is_loopback_client
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.serve.status import add_status_route
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient

from tests.reliability.tenants import serve_in_thread

LOCAL = "http://localhost"  # open mode answers only trusted Host names

MSG = [{"role": "user", "content": "hello"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _app(status_route=True, tenants=(), **server):
    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 64}],
            "server": server,
            "tenants": list(tenants),
        }
    )
    engine = FakeEngine("m", 64)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})
    if status_route:  # as serve/app.py does (GET /status asks Ray: never called here)
        add_status_route(app)
    return app


@pytest.mark.parametrize(
    ("client", "loopback"),
    [
        (("127.0.0.1", 1), True),
        (("127.8.9.1", 1), True),
        (("::1", 1), True),
        (("localhost", 1), True),
        (("10.0.0.5", 1), False),
        (("::ffff:10.0.0.5", 1), False),
        (("testclient", 1), False),
        (None, False),
    ],
)
def test_is_loopback_client(client, loopback):
    assert is_loopback_client(client) is loopback


@pytest.mark.parametrize(
    ("metrics_port", "server_port", "path", "client", "allowed"),
    [
        (None, 8000, "/metrics", "127.0.0.1", True),
        (None, 8000, "/status", "127.0.0.1", True),
        (None, 8000, "/metrics", "203.0.113.9", False),
        (None, 8000, "/status", "203.0.113.9", False),
        (None, 8000, "/v1/models", "203.0.113.9", True),
        (None, 8000, "/health", "203.0.113.9", True),
        (9100, 8000, "/metrics", "127.0.0.1", False),  # API port: never, even for loopback
        (9100, 8000, "/v1/chat/completions", "203.0.113.9", True),
        (9100, 9100, "/metrics", "203.0.113.9", True),  # the metrics port: admin paths
        (9100, 9100, "/status", "203.0.113.9", True),
        (9100, 9100, "/health", "203.0.113.9", True),
        (9100, 9100, "/v1/chat/completions", "127.0.0.1", False),  # and nothing else
    ],
)
def test_gate_table(metrics_port, server_port, path, client, allowed):
    gate = AdminGate(None, metrics_port)
    scope = {"type": "http", "path": path, "server": ("x", server_port), "client": (client, 5)}
    assert gate.allows(scope) is allowed


def test_remote_clients_get_404_for_admin_paths_on_the_api_port():
    app = _app()
    remote = TestClient(app, base_url=LOCAL, client=("198.51.100.7", 4000))
    for path in ("/metrics", "/status"):
        r = remote.get(path)
        assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"
    assert remote.get("/v1/models").status_code == 200
    assert remote.get("/health").status_code == 200
    local = TestClient(app, base_url=LOCAL, client=("127.0.0.1", 4000))
    assert "agentserve_requests_in_flight" in local.get("/metrics").text


def test_health_names_the_models_only_to_callers_who_may_list_them():
    tenants = [{"name": "a", "api_key_sha256": hash_api_key("sk-a"), "sla": {}}]
    port = _free_port()
    app = _app(tenants=tenants, metrics_port=port)
    remote = TestClient(app, base_url=LOCAL, client=("198.51.100.7", 4000))
    r = remote.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}, "a probe needs no names"
    r = remote.get("/health", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = remote.get("/health", headers={"Authorization": "Bearer sk-a"})
    assert r.json() == {"status": "ok", "models": {"m": "ok"}}
    assert remote.get("/v1/models").status_code == 401  # the same rule as listing them
    local = TestClient(app, base_url=LOCAL, client=("127.0.0.1", 4000))
    assert local.get("/health").json()["models"] == {"m": "ok"}  # `agentserve status`
    with TestClient(app, base_url=LOCAL, client=("127.0.0.1", 4000)):  # admin listener up
        admin_health = httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False)
        assert admin_health.json()["models"] == {"m": "ok"}  # the operator's port
    open_app = _app()  # no keys: anyone may list the models
    r = TestClient(open_app, base_url=LOCAL, client=("198.51.100.7", 4000)).get("/health")
    assert r.json() == {"status": "ok", "models": {"m": "ok"}}


def test_metrics_port_serves_admin_paths_and_the_api_port_never_does():
    port = _free_port()
    app = _app(metrics_port=port)
    with TestClient(
        app, base_url=LOCAL, client=("127.0.0.1", 4000)
    ) as api:  # lifespan: admin listener up
        assert api.post("/v1/chat/completions", json={"model": "m", "messages": MSG}).is_success
        assert api.get("/metrics").status_code == 404
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as admin:
            text = admin.get("/metrics").text
            assert 'agentserve_requests_total{model="m",status="200",tenant="default"}' in text
            assert admin.get("/health").status_code == 200
            assert admin.get("/v1/models").status_code == 404
            r = admin.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
            assert r.status_code == 404
    with pytest.raises(httpx.ConnectError):  # stopped with the app
        httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False)


def test_a_busy_metrics_port_is_logged_retried_and_the_api_still_serves(caplog, monkeypatch):
    monkeypatch.setattr(admin, "BIND_RETRY_S", 0.05)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    app = _app(metrics_port=port)
    with caplog.at_level(logging.ERROR), TestClient(app, base_url=LOCAL) as api:
        r = api.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
        assert r.status_code == 200
        busy.close()  # e.g. the replica this one replaces went away
        for _ in range(100):
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False)
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        assert r.status_code == 200 and "agentserve_requests_total" in r.text
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text


def test_status_reads_admin_paths_from_the_metrics_port():
    port = _free_port()
    app = _app(status_route=False, metrics_port=port)  # /status would start Ray
    assert admin_url(app.state.ingress.spec) == f"http://127.0.0.1:{port}"
    assert admin_url(DeploymentSpec()) == "http://127.0.0.1:8000"
    with serve_in_thread(app, lifespan="on") as base:
        httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": MSG})
        report = fetch_report(base, admin_url=f"http://127.0.0.1:{port}")
        assert report.health["status"] == "ok"
        assert report.metrics.models, "metrics came from the admin port"
        assert not fetch_report(base).metrics.models  # the API port does not serve them

"""Issue 64 item 8: Ray's and the engine's own error text never reaches a client: an
unavailable engine (503) or an unexpected error (500) answers a generic message with a
request id, and the full text is logged under that id (api/errors.py)."""

from __future__ import annotations

import logging

from agentserve.api.errors import error_body, install_error_handlers
from agentserve.engine.protocol import EngineDeadError, EngineUnavailableError
from fastapi import FastAPI
from fastapi.testclient import TestClient

SECRET = "actor 4f2a at 10.0.3.7 pid 4242: CUDA error in /opt/vllm/worker.py"


def test_an_unavailable_engine_answers_a_request_id_not_its_text(caplog):
    with caplog.at_level(logging.WARNING, "agentserve.serve.ingress"):
        body = error_body(EngineDeadError(SECRET), "req-123")
    message = body["error"]["message"]
    assert SECRET not in message and "req-123" in message
    assert body["error"]["code"] == "overloaded"
    assert any("req-123" in r.getMessage() and SECRET in r.getMessage() for r in caplog.records)


def test_an_unexpected_error_answers_a_request_id_not_its_text():
    body = error_body(RuntimeError(SECRET))
    assert SECRET not in body["error"]["message"]
    assert "request id" in body["error"]["message"]


def _app(err: Exception) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise err

    return TestClient(app, raise_server_exceptions=False)


def test_the_handlers_send_the_id_they_logged():
    r = _app(EngineUnavailableError(SECRET)).get("/boom", headers={"x-request-id": "abc"})
    assert r.status_code == 503 and SECRET not in r.text
    assert r.headers["x-request-id"] == "abc" and "abc" in r.json()["error"]["message"]
    r = _app(ValueError(SECRET)).get("/boom")
    assert r.status_code == 500 and SECRET not in r.text
    assert r.headers["x-request-id"] in r.json()["error"]["message"]

"""The ingress's edges (fake engine): the API description needs a key when keys exist,
/health never echoes exception text, a client that goes away is counted 499 and its
generation aborted, and an unexpected error mid-stream ends the stream with an error
event and counts 500."""

from __future__ import annotations

import asyncio
import logging

import pytest
from agentserve.engine.protocol import Delta
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import Call, asgi_request

KEY = "sk-edges-test-key"
URL = "/v1/chat/completions"
LONG = {"model": "m", "messages": [{"role": "user", "content": "w " * 40}], "max_tokens": 40}


def _spec(keys: bool = False) -> DeploymentSpec:
    tenants = [{"name": "a", "api_key_sha256": hash_api_key(KEY), "sla": {}}] if keys else []
    return DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 256}], "tenants": tenants}
    )


def _app(backend=None, *, keys: bool = False, delay_s: float = 0.0):
    engine = FakeEngine("m", 256, token_delay_s=delay_s, accept_per_step=1)
    asyncio.run(engine.start())
    return create_app(_spec(keys), {"m": backend or LocalBackend(engine)}), engine


def _requests_counted(app, status: int) -> float:
    value = app.state.ingress.endpoints.metrics.registry.get_sample_value(
        "agentserve_requests_total", {"model": "m", "tenant": "default", "status": str(status)}
    )
    return value or 0.0


@pytest.mark.parametrize(("keys", "headers", "status"), [
    (True, {}, 401),
    (True, {"authorization": f"Bearer {KEY}"}, 200),
    (False, {}, 200),
])  # fmt: skip
def test_openapi_needs_a_key_when_keys_are_configured(keys, headers, status):
    app, _ = _app(keys=keys)
    call = asyncio.run(asgi_request(app, "GET", "/openapi.json", headers=headers))
    assert call.status == status
    if status == 200:
        assert "/v1/chat/completions" in call.json()["paths"]
    else:
        assert call.json()["error"]["code"] == "invalid_api_key"


class _Broken(LocalBackend):
    async def health(self) -> None:
        raise RuntimeError("connection to 10.0.0.7:6379 refused (token=abc123)")


def test_health_reports_no_exception_text(caplog):
    engine = FakeEngine("m", 256)
    app, _ = _app(_Broken(engine))
    with caplog.at_level(logging.WARNING):
        call = asyncio.run(asgi_request(app, "GET", "/health"))
    assert call.status == 503
    assert call.json() == {"status": "unavailable", "models": {"m": "unavailable"}}
    assert "10.0.0.7" in caplog.text, "the detail is logged for the operator"


@pytest.mark.parametrize("stream", [False, True])
def test_a_cancelled_request_is_counted_499(stream):
    app, _ = _app(delay_s=0.02)

    async def run() -> None:
        task = asyncio.ensure_future(asgi_request(app, "POST", URL, {**LONG, "stream": stream}))
        await asyncio.sleep(0.2)  # generating
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert _requests_counted(app, 499) == 1
    assert _requests_counted(app, 500) == 0


def test_a_non_stream_request_is_aborted_when_its_client_goes():
    app, engine = _app(delay_s=0.02)  # 40 tokens: 0.8 s

    async def run() -> Call:
        gone = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, gone.set)
        return await asgi_request(app, "POST", URL, LONG, disconnect=gone)

    asyncio.run(run())
    (request,) = engine.requests
    assert request.request_id in engine.aborted, "generation stopped with the client"
    assert _requests_counted(app, 499) == 1 and _requests_counted(app, 200) == 0


class _FailsMidStream(LocalBackend):
    async def _gen(self, request):
        yield Delta("hello", 3, 1)
        raise KeyError("a bug, not an engine error")

    def generate(self, request):
        return self._gen(request)


def test_an_unexpected_error_mid_stream_sends_an_error_event_and_counts_500():
    app, _ = _app(_FailsMidStream(FakeEngine("m", 256)))
    call = asyncio.run(asgi_request(app, "POST", URL, {**LONG, "stream": True}))
    events = [line[6:] for line in call.text().splitlines() if line.startswith("data: ")]
    assert '"hello"' in events[1]
    assert '"error"' in events[-1] and "server_error" in events[-1]
    assert "a bug" not in call.text(), "no internal detail in the event"
    assert _requests_counted(app, 500) == 1 and _requests_counted(app, 200) == 0


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(("keys", "headers", "status", "code"), [
    (False, {"host": "attacker.example:8000"}, 400, "untrusted_host"),  # DNS rebinding
    (False, {"host": "127.0.0.1.attacker.example"}, 400, "untrusted_host"),
    (False, {"host": "localhost:8000", "content-type": "text/plain"}, 415,
     "unsupported_media_type"),  # a cross-site form or fetch without preflight
    (False, {"host": "[::1]:8000", "content-type": ""}, 415, "unsupported_media_type"),
    (False, {"host": "LOCALHOST:8000", **JSON}, 200, None),
    (False, {"host": "[::1]:8000", "content-type": "application/json; charset=utf-8"}, 200,
     None),
    (False, {"host": "devbox.internal:8000", **JSON}, 200, None),  # server.trusted_hosts
    (True, {"host": "api.example.com", "content-type": "text/plain",
            "authorization": f"Bearer {KEY}"}, 200, None),  # with keys: no browser threat
])  # fmt: skip
def test_open_mode_answers_only_trusted_hosts_and_json_posts(keys, headers, status, code):
    spec = _spec(keys).model_copy(deep=True)
    spec.server.trusted_hosts = ["DevBox.internal"]
    engine = FakeEngine("m", 256)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    call = asyncio.run(asgi_request(app, "POST", URL, body, headers=headers))
    assert call.status == status, call.text()
    if code:
        assert call.json()["error"]["code"] == code
        assert not engine.requests, "refused before the engine"


def test_untrusted_host_cannot_read_health_either():
    app, _ = _app()
    call = asyncio.run(asgi_request(app, "GET", "/health", headers={"host": "evil.example"}))
    assert call.status == 400


def test_trusted_hosts_come_from_the_spec_or_the_cli():
    from agentserve.cli import build_parser
    from agentserve.cli.up import with_overrides

    args = build_parser().parse_args(["up", "--trusted-host", "a.lan", "--trusted-host", "b"])
    spec = with_overrides(DeploymentSpec(), None, None, args.trusted_host)
    assert spec.server.trusted_hosts == ["a.lan", "b"]
    assert build_parser().parse_args(["up"]).trusted_host is None

"""serve/ready.wait_ready: the one readiness loop of `agentserve up` and the overhead
benchmark, driven with scripted Serve states and /health answers (no Ray)."""

from __future__ import annotations

import threading

from agentserve.serve.ready import wait_ready

URL = "http://127.0.0.1:8000"


def _app(status: str, replica: str = "RUNNING", message: str = "") -> dict:
    deployment = {"status": "HEALTHY" if replica == "RUNNING" else replica, "message": message}
    deployment["replicas"] = {replica: 1}
    return {"status": status, "deployments": {"dep-m": deployment}}


def _states(*states):
    """An app_state callable returning `states` in order (an Exception is raised)."""
    it = iter(states)

    def read():
        state = next(it)
        if isinstance(state, Exception):
            raise state
        return state

    return read


def test_ready_needs_serve_healthy_and_a_200_from_health():
    seen, lines = [], []
    outcome = wait_ready(
        URL,
        timeout_s=60,
        model_deployments={"dep-m": "m"},
        poll_s=0,
        app_state=_states(
            ConnectionError("controller starting"),
            None,
            _app("DEPLOYING", "STARTING"),
            _app("RUNNING"),
            _app("RUNNING"),
        ),
        health=lambda url: seen.append(url) or len(seen) > 1,  # first /health: not yet
        on_progress=lambda elapsed, line: lines.append(line),
    )
    assert outcome.phase == "ready"
    assert seen == [URL, URL]
    assert lines[0] == "waiting for the Serve controller (ConnectionError)"
    assert lines[1] == "submitting the application to Ray Serve"
    assert lines[2] == "model m: replicas 1 STARTING"


def test_a_failed_deployment_ends_the_wait_with_its_messages():
    failed = _app("DEPLOY_FAILED", "UNHEALTHY", message="engine died: out of memory")
    outcome = wait_ready(
        URL,
        timeout_s=60,
        poll_s=0,
        app_state=_states(_app("DEPLOYING", "STARTING"), failed),
        health=lambda url: True,
    )
    assert outcome.phase == "failed"
    assert outcome.detail == "dep-m: engine died: out of memory"


def test_timeout_reports_the_last_progress_line():
    outcome = wait_ready(
        URL,
        timeout_s=0,
        started=0.0,  # long ago on the monotonic clock
        poll_s=0,
        app_state=lambda: _app("DEPLOYING", "STARTING"),
        health=lambda url: True,
    )
    assert outcome.phase == "timeout"
    assert outcome.detail == "dep-m: replicas 1 STARTING"


def test_a_stop_signal_ends_the_wait_without_polling():
    stop = threading.Event()
    stop.set()
    outcome = wait_ready(URL, timeout_s=60, stop=stop, app_state=_states(), health=lambda u: True)
    assert outcome.phase == "stopped"

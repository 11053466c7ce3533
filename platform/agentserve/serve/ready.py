"""Wait until a local deployment serves: the one readiness loop `agentserve up` and the
overhead benchmark share.

Ready means what a client needs: Serve reports the app RUNNING with every deployment
HEALTHY (local.readiness) AND GET /health answers 200 on the API address. The loop
decides; the callers print (`on_progress`) and turn the outcome into their own exit code
or exception. The Serve status and the HTTP check are parameters, so the loop is
testable without Ray.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agentserve.serve.local import current_app_state, describe_progress, readiness

__all__ = ["WaitOutcome", "http_ready", "wait_ready"]


@dataclass(frozen=True)
class WaitOutcome:
    """How the wait ended: "ready"; "failed" (detail: the deployments' messages);
    "timeout" (detail: the last progress line); "stopped" (the stop event was set)."""

    phase: Literal["ready", "failed", "timeout", "stopped"]
    detail: str = ""


def http_ready(base_url: str) -> bool:
    """GET {base_url}/health answers 200 (a local address: never through a proxy)."""
    import httpx

    try:
        return httpx.get(f"{base_url}/health", timeout=5.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(
    base_url: str,
    *,
    timeout_s: float,
    model_deployments: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[float, str], None] | None = None,
    poll_s: float = 1.0,
    started: float | None = None,
    app_state: Callable[[], dict[str, Any] | None] = current_app_state,
    health: Callable[[str], bool] = http_ready,
) -> WaitOutcome:
    """Every `poll_s`: read the app's Serve status; "failed" ends the wait at once, ready
    plus a 200 from /health ends it "ready"; past `timeout_s` since `started` (default:
    now, time.monotonic) it ends "timeout"; otherwise `on_progress(elapsed_s, line)` with
    a line saying what is starting (local.describe_progress; `model_deployments` maps
    deployment name -> model name). A status read that raises (the controller still
    starting) counts as starting."""
    stop = stop or threading.Event()
    started = time.monotonic() if started is None else started
    names = dict(model_deployments or {})
    while not stop.wait(poll_s):
        elapsed = time.monotonic() - started
        try:
            app = app_state()
        except Exception as err:  # controller still starting or busy: try again
            line = f"waiting for the Serve controller ({type(err).__name__})"
        else:
            line = describe_progress(app, names)
            state = readiness(app)
            if state.phase == "failed":
                return WaitOutcome("failed", state.detail)
            if state.phase == "ready" and health(base_url):
                return WaitOutcome("ready")
        if elapsed > timeout_s:
            return WaitOutcome("timeout", line)
        if on_progress is not None:
            on_progress(elapsed, line)
    return WaitOutcome("stopped")

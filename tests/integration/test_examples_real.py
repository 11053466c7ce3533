"""The examples unchanged against the real engine: `agentserve up --traces` with the
default spec (bundled SmolLM2 on vLLM, CPU) for 01 and 02 (its trace read back from
Phoenix down to the decode span), and example 03's own spec for 03. Minutes: slow.

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_examples_real.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from phoenix_api import ancestry, phoenix_spans
from up_server import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
READY_TIMEOUT_S = 900


def _phoenix_args() -> tuple[list[str], str]:
    port = free_port()
    args = ["--traces", "--traces-port", str(port), "--traces-grpc-port", str(free_port())]
    return args, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def default_up(start_up, tmp_path_factory):
    pytest.importorskip("agents")
    args, phoenix = _phoenix_args()
    with pytest.MonkeyPatch.context() as env:  # Phoenix's database in a temporary directory
        env.setenv("PHOENIX_WORKING_DIR", str(tmp_path_factory.mktemp("phoenix")))
        return start_up(*args, ready_timeout_s=READY_TIMEOUT_S), phoenix


def _run(script: str, base_url: str, *args: str, **env: str) -> str:
    environ = {**os.environ, "AGENTSERVE_BASE_URL": base_url, "NO_PROXY": "127.0.0.1", **env}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_01_chat_real(default_up):
    server, _ = default_up
    out = _run("01-chat/chat.py", f"{server.url}/v1")
    assert out.count("assistant: ") == 2


def test_02_multi_agent_real_trace(default_up):
    server, phoenix = default_up
    out = _run(
        "02-multi-agent/multi_agent.py", f"{server.url}/v1", OTEL_EXPORTER_OTLP_ENDPOINT=phoenix
    )
    assert out.startswith("answer: ")
    trace_id = re.search(r"trace id: ([0-9a-f]{32})", out).group(1)
    want = {"invoke_agent coordinator", "ingress", "replica", "prefill", "decode"}
    chain = _whole_decode_chain(phoenix, trace_id, want)
    assert chain[:3] == ["replica", "ingress", "chat smollm2-135m-instruct"], chain
    assert "invoke_agent coordinator" in chain


def _whole_decode_chain(phoenix: str, trace_id: str, want: set[str]) -> list[str]:
    """The ancestry of a decode span once the whole chain up to the agent has arrived (an
    agent run makes several model calls; their spans reach Phoenix one batch at a time)."""
    deadline = time.monotonic() + 120
    while True:
        spans = phoenix_spans(phoenix, trace_id, want, timeout_s=120)
        by_id = {s["context"]["span_id"]: s for s in spans}
        chains = [ancestry(s, by_id) for s in spans if s["name"] == "decode"]
        whole = [c for c in chains if "invoke_agent coordinator" in c]
        if whole or time.monotonic() > deadline:
            return whole[0] if whole else max(chains, key=len)
        time.sleep(2)


def test_03_sla_tenants_real(start_up):
    server = start_up(
        "--spec", str(EXAMPLES / "03-sla-tenants" / "tenants.yaml"), ready_timeout_s=READY_TIMEOUT_S
    )
    out = _run("03-sla-tenants/sla_tenants.py", f"{server.url}/v1", "--requests", "4")
    assert "interactive" in out and "batch" in out and "server: deployment" in out

"""`agentserve up` as a user runs it: a subprocess serving a fake-engine spec on local Ray,
driven by the official openai client, `agentserve status`, `agentserve chat`, the snippets
it prints and the README's "Try it on CPU" commands; then SIGINT: clean exit, port released.

stdout is a pipe here, so `up` runs in plain (agent) mode: every stdout line must be JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from agentserve.cli.up import check_port_free
from agentserve.sources.models import BUNDLED_MODEL
from up_server import agentserve_cmd, free_port

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300
# the fake engine under the bundled model's name, so the README's commands run unchanged
SPEC = f"""\
models:
  - name: {BUNDLED_MODEL}
    engine: fake
    max_model_len: 512
    replicas: {{num_cpus: 0.1}}
"""


@pytest.fixture(scope="module")
def server(start_up, tmp_path_factory):
    spec = tmp_path_factory.mktemp("spec") / "fake.yaml"
    spec.write_text(SPEC)
    return start_up("--spec", str(spec), ready_timeout_s=READY_TIMEOUT_S)


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*agentserve_cmd(), *args], capture_output=True, text=True, timeout=timeout
    )


def test_ready_event_names_url_model_and_examples(server):
    ready = server.ready
    assert ready["url"] == server.url and ready["base_url"] == f"{server.url}/v1"
    assert ready["models"] == [BUNDLED_MODEL]
    assert ready["drafters"] == {BUNDLED_MODEL: None}
    assert ready["curl"].startswith(f"curl {server.url}/v1/chat/completions")


def test_openai_client_chat_stream_and_models(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == [BUNDLED_MODEL]
    messages = [{"role": "user", "content": "hello up"}]
    chat = client.chat.completions.create(model=BUNDLED_MODEL, messages=messages)
    assert chat.choices[0].message.content.startswith("echo: hello up")
    stream = client.chat.completions.create(
        model=BUNDLED_MODEL,
        messages=messages,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: hello up" and chunks[-1].usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=messages)


def test_printed_examples_run(server):
    if shutil.which("curl") is not None:
        out = subprocess.run(["bash", "-c", server.ready["curl"]], capture_output=True, text=True)
        assert out.returncode == 0 and json.loads(out.stdout)["choices"][0]["message"]["content"]
    out = subprocess.run(
        [sys.executable, "-c", server.ready["python"]], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("echo: Hello!")


def _readme_use_it_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## 1. Try it on CPU", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(bash|python)\n(.*?)```", section, flags=re.S)


def test_readme_use_it_commands_run(server):
    blocks = _readme_use_it_blocks()
    assert {lang for lang, _ in blocks} == {"bash", "python"}
    env = {**os.environ, "AGENTSERVE_BASE_URL": f"{server.url}/v1"}
    for lang, code in blocks:
        code = code.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
        if lang == "bash" and "curl " in code and shutil.which("curl") is None:
            continue
        code = code.replace(".venv/bin/agentserve", " ".join(agentserve_cmd()))
        cmd = ["bash", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        out = subprocess.run(
            cmd, input="Hello!\n", capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
        )
        assert out.returncode == 0, f"{code}\n{out.stderr}"
        assert "echo: Hello!" in out.stdout, out.stdout


def test_status_command_shows_deployments_and_latency(server):
    out = _run("status", "--url", server.url)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    deployments = {r["deployment"]: r for r in records if r["kind"] == "deployment"}
    assert set(deployments) == {"ingress", f"model-{BUNDLED_MODEL}"}
    assert all(
        d["status"] == "HEALTHY" and d["replicas"] == "1 RUNNING" for d in deployments.values()
    )
    (model,) = [r for r in records if r["kind"] == "model"]
    assert model["health"] == "ok" and model["draft_tokens"] > 0  # the fake "speculates"
    latency = [r for r in records if r["kind"] == "latency"]
    assert latency and latency[0]["requests"] >= 2 and latency[0]["ttft_p50_ms"] is not None


def test_chat_command_one_shot(server):
    out = _run("chat", "--url", server.url, "--max-tokens", "8", "hi", "there")
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["content"] == "echo: hi there" and reply["completion_tokens"] == 3


def test_chat_reads_turns_from_stdin_until_eof(server):
    out = subprocess.run(
        [*agentserve_cmd(), "chat", "--url", server.url, "--max-tokens", "4"],
        input="first\n\nsecond\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    replies = [json.loads(line)["content"] for line in out.stdout.splitlines()]
    assert [r.split()[:2] for r in replies] == [["echo:", "first"], ["echo:", "second"]]


def test_sigint_stops_cleanly_and_releases_the_port(server):
    assert server.stop() == 0, server.stderr()
    assert server.wait_for("stopped", 10)["event"] == "stopped"
    check_port_free("127.0.0.1", server.port)  # raises when something still listens
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), 2):
        pass
    assert all(line.startswith("{") for line in server.lines)


def test_status_of_a_stopped_server_fails_clearly():
    out = _run("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1 and "agentserve up" in out.stderr

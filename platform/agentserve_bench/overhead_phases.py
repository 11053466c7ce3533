"""The systems `agentserve bench overhead` measures, one phase each, every concurrency level
in turn: the bare engine in process ("bare"), vLLM's own OpenAI server ("vllm_serve",
overhead_peers.py), Ray Serve LLM ("ray_serve_llm", overhead_rayllm.py) and the app
`agentserve up` serves ("agentserve")."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from agentserve.engine.vllm_engine import VLLMEngine
from agentserve.serve import local
from agentserve.serve.ready import wait_ready
from agentserve.spec import DeploymentSpec, ModelSpec

from agentserve_bench.overhead_peers import vllm_server
from agentserve_bench.overhead_rayllm import rayllm_server
from agentserve_bench.overhead_requests import (
    async_llm_request_fn,
    engine_request_fn,
    http_request_fn,
)
from agentserve_bench.overhead_stats import OneRequest, level_stats, run_level

__all__ = [
    "Plan",
    "PlatformRunner",
    "bare_fake",
    "bare_vllm",
    "cuda_available",
    "http_levels",
    "platform_phase",
    "ray_serve_llm_phase",
    "vllm_serve_phase",
]


@dataclass(frozen=True)
class Plan:
    """What both phases run: prompts, levels, requests per level, output length."""

    prompts: tuple[str, ...]
    concurrency: tuple[int, ...]
    max_tokens: int
    rounds: int = 2
    min_requests: int = 8

    def requests(self, concurrency: int) -> int:
        return max(self.min_requests, self.rounds * concurrency)


async def _run_levels(one: OneRequest, plan: Plan, side: str) -> dict[int, dict[str, Any]]:
    """A warm-up request, then every level in order; prints one line per level."""
    await one(f"{side}-warmup", plan.prompts[0])
    figures = {}
    for c in plan.concurrency:
        timings, wall_s = await run_level(one, plan.prompts, c, plan.requests(c), f"{side}-c{c}")
        figures[c] = level_stats(timings, wall_s)
        f = figures[c]
        print(
            f"  {side:10s} c={c:<3d} {f['tokens_per_s']} tok/s  TPOT {f['tpot_ms']} ms  "
            f"TTFT {f['ttft_ms']} ms  ({f['requests']} requests, {f['wall_s']} s)",
            flush=True,
        )
    return figures


def bare_fake(model: ModelSpec, engine_factory: Any, plan: Plan) -> dict[int, dict[str, Any]]:
    async def go() -> dict[int, dict[str, Any]]:
        engine = engine_factory(model)
        await engine.start()
        try:
            return await _run_levels(
                engine_request_fn(engine, model.name, plan.max_tokens), plan, "bare"
            )
        finally:
            await engine.stop()

    return asyncio.run(go())


def _bare_vllm_worker(model_json: dict, model_dir: str, plan: Plan) -> dict[int, dict[str, Any]]:
    """Runs in a fresh spawned process: VLLMEngine.start() as a replica does, then its
    AsyncLLM directly."""

    async def go() -> dict[int, dict[str, Any]]:
        engine = VLLMEngine(ModelSpec.model_validate(model_json), model_dir=model_dir)
        await engine.start()
        try:
            llm = engine.async_llm
            tokenizer = llm.get_tokenizer()
            if inspect.isawaitable(tokenizer):
                tokenizer = await tokenizer
            return await _run_levels(
                async_llm_request_fn(llm, tokenizer, plan.max_tokens), plan, "bare"
            )
        finally:
            await engine.stop()

    return asyncio.run(go())


def bare_vllm(model: ModelSpec, model_dir: str, plan: Plan) -> dict[int, dict[str, Any]]:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(
            _bare_vllm_worker, model.model_dump(mode="json"), model_dir, plan
        ).result()


def _wait_ready(base_url: str, timeout_s: float) -> None:
    """serve/ready.wait_ready, printing progress every 10 s; raise on failure or timeout."""
    last_print = 0.0

    def progress(elapsed: float, text: str) -> None:
        nonlocal last_print
        if elapsed - last_print >= 10:
            last_print = elapsed
            print(f"  platform starting ({elapsed:.0f} s): {text}", flush=True)

    outcome = wait_ready(base_url, timeout_s=timeout_s, on_progress=progress)
    if outcome.phase == "failed":
        raise RuntimeError(f"the app failed to start: {outcome.detail}")
    if outcome.phase != "ready":
        raise TimeoutError(f"not ready after {timeout_s:.0f} s: {outcome.detail}")


async def http_levels(
    base_url: str, model: str, plan: Plan, system: str = "agentserve", timeout_s: float = 600
) -> dict[int, dict]:
    """Every level over HTTP against an OpenAI-compatible server at `base_url`."""
    import httpx

    limits = httpx.Limits(max_connections=max(plan.concurrency) + 4)
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=httpx.Timeout(timeout_s), trust_env=False
    ) as client:
        one = http_request_fn(client, model, plan.max_tokens)
        return await _run_levels(one, plan, system)


PlatformRunner = Callable[[DeploymentSpec, Any, Plan, float], dict[int, dict[str, Any]]]
"""(spec, engine factory, plan, start timeout s) -> figures per concurrency."""


def platform_phase(
    spec: DeploymentSpec, engine_factory: Any, plan: Plan, start_timeout_s: float
) -> dict[int, dict[str, Any]]:
    """Start the app on a fresh local Ray (serve/local.py, as `agentserve up` does), run
    the levels over HTTP, stop it."""

    base_url = f"http://{spec.server.host}:{spec.server.port}"
    local.start_local(spec, engine_factory=engine_factory)
    try:
        _wait_ready(base_url, start_timeout_s)
        timeout_s = spec.server.request_timeout_s
        return asyncio.run(http_levels(base_url, spec.models[0].name, plan, timeout_s=timeout_s))
    finally:
        # Serve's shutdown makes Ray print expected "actor is dead" task errors: drop them
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            local.stop_local()


def vllm_serve_phase(
    model: ModelSpec, model_dir: str, plan: Plan, start_timeout_s: float, log_dir: Path
) -> dict[int, dict[str, Any]]:
    """vLLM's own OpenAI server with the replica's engine arguments, the levels over HTTP."""

    port = free_port()
    log_path = log_dir / "vllm_serve.log"
    with vllm_server(model, model_dir, port, start_timeout_s, log_path) as base_url:
        print(f"  vllm_serve ready at {base_url} (log: {log_path})", flush=True)
        return asyncio.run(http_levels(base_url, model.name, plan, "vllm_serve"))


def ray_serve_llm_phase(
    model: ModelSpec, model_dir: str, plan: Plan, start_timeout_s: float, log_dir: Path
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Ray Serve LLM with the replica's engine arguments (its own Ray cluster in a
    subprocess), the levels over HTTP; returns the figures and what it ran with."""

    port = free_port()
    cpu = not cuda_available()
    with rayllm_server(model, model_dir, port, start_timeout_s, log_dir, cpu=cpu) as (url, info):
        print(
            f"  ray_serve_llm ready at {url} (ray {info.get('ray')}, stream batching "
            f"{info.get('stream_batching_interval_ms')} ms; log: {log_dir / 'ray_serve_llm.log'})",
            flush=True,
        )
        figures = asyncio.run(http_levels(url, model.name, plan, "ray_serve_llm"))
    settings = {k: info.get(k) for k in ("ray", "vllm", "stream_batching_interval_ms")}
    return figures, {**settings, "accelerator": "cpu" if cpu else "gpu"}


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # no torch or a broken driver: CPU
        return False


def free_port() -> int:

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

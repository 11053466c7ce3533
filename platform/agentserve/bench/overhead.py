"""`agentserve bench overhead`: what HTTP + Ray Serve add per token over the bare engine.

The same prompts, greedy with a fixed output length (ignore_eos), go (a) straight into the
engine in this machine's memory and (b) through the app `agentserve up` serves (ingress,
Ray Serve handle, replica, SSE over HTTP), one phase after the other, at each concurrency.
Per request: TTFT, and TPOT = (last token time - first token time) / (output tokens - 1),
both measured at the caller. Per level: tokens/s = output tokens / phase wall time.
overhead_ratio = platform mean TPOT / bare mean TPOT; throughput_ratio = platform tokens/s /
bare tokens/s. Engines: "vllm" (bare = vLLM's AsyncLLM.generate on chat-templated token
ids, started by VLLMEngine exactly as a replica starts it, in a spawned process) and
"fake" (bare = the FakeEngine through the Engine protocol; tests only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform as host
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from agentserve.bench.overhead_requests import (
    async_llm_request_fn,
    engine_request_fn,
    http_request_fn,
)
from agentserve.bench.overhead_stats import (
    OneRequest,
    RequestTiming,
    compare_levels,
    fmt_number,
    level_stats,
    markdown_table,
    run_level,
    verdict,
)
from agentserve.spec import DeploymentSpec, ModelSpec

__all__ = ["PROMPTS", "RequestTiming", "add_parser", "compare_levels", "level_stats", "run"]

JSON_NAME = "platform_overhead.json"
SECTION = "platform-overhead"
PROMPTS = (
    "You are a coding agent. Read the failing test output below, explain in two sentences "
    "what the bug in the parser is, then write a corrected version of the function that "
    "splits a comma separated line into fields while respecting double quotes.",
    "Summarise the trade-offs between continuous batching and static batching for a "
    "language model server that serves many short agent tool calls and a few long "
    "report generations, and say which latency figure each one improves.",
    "Plan the steps an agent should take to find every Python file in a repository that "
    "imports a deprecated module, replace the import with the new one, run the tests and "
    "report which files changed and which tests failed afterwards.",
    "Write a short explanation, for a new engineer, of what time to first token and time "
    "per output token mean, how queueing changes the first one, and why speculative "
    "decoding changes the second one but not the first one.",
    "Given a list of customer support tickets with a priority and an age in hours, "
    "describe an algorithm that orders them so urgent old tickets come first, state its "
    "complexity, and give a small worked example with five tickets.",
    "Draft a polite email to a colleague asking them to review a pull request that adds "
    "request tracing to the ingress service, mentioning what changed, how it was tested, "
    "and what you would like them to look at most carefully.",
    "Explain how a hash map handles collisions with open addressing and with separate "
    "chaining, compare their memory use and cache behaviour, and say which one you would "
    "choose for a small in-memory cache of session identifiers.",
    "A tool returned a JSON object with the fields name, price and stock for twelve "
    "products. Describe how an agent should check the data for missing or negative values "
    "and produce a table of the products that need restocking first.",
)


# -- phases -----------------------------------------------------------------------------------
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
            f"  {side:8s} c={c:<3d} {f['tokens_per_s']} tok/s  TPOT {f['tpot_ms']} ms  "
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
    import inspect

    from agentserve.engine.vllm_engine import VLLMEngine

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
    """Poll Serve's status and /health until the app serves; raise on failure or timeout."""
    import httpx

    from agentserve.serve.local import current_app_state, readiness

    started = last_print = time.monotonic()
    while True:
        try:
            state = readiness(current_app_state())
        except Exception as err:  # the controller may still be starting
            state = None
            detail = type(err).__name__
        else:
            detail = state.detail
            if state.phase == "failed":
                raise RuntimeError(f"the app failed to start: {state.detail}")
        if state is not None and state.phase == "ready":
            try:
                if httpx.get(f"{base_url}/health", timeout=5, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        now = time.monotonic()
        if now - started > timeout_s:
            raise TimeoutError(f"not ready after {timeout_s:.0f} s: {detail}")
        if now - last_print >= 10:
            last_print = now
            print(f"  platform starting ({now - started:.0f} s): {detail}", flush=True)
        time.sleep(1.0)


async def http_levels(base_url: str, spec: DeploymentSpec, plan: Plan) -> dict[int, dict]:
    """Every level over HTTP against a serving platform at `base_url`."""
    import httpx

    limits = httpx.Limits(max_connections=max(plan.concurrency) + 4)
    timeout = httpx.Timeout(spec.server.request_timeout_s)
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=timeout, trust_env=False
    ) as client:
        one = http_request_fn(client, spec.models[0].name, plan.max_tokens)
        return await _run_levels(one, plan, "platform")


PlatformRunner = Callable[[DeploymentSpec, Any, Plan, float], dict[int, dict[str, Any]]]
"""(spec, engine factory, plan, start timeout s) -> figures per concurrency."""


def platform_phase(
    spec: DeploymentSpec, engine_factory: Any, plan: Plan, start_timeout_s: float
) -> dict[int, dict[str, Any]]:
    """Start the app on a fresh local Ray (serve/local.py, as `agentserve up` does), run
    the levels over HTTP, stop it."""
    from agentserve.serve import local

    base_url = f"http://{spec.server.host}:{spec.server.port}"
    local.start_local(spec, engine_factory=engine_factory)
    try:
        _wait_ready(base_url, start_timeout_s)
        return asyncio.run(http_levels(base_url, spec, plan))
    finally:
        # Serve's shutdown makes Ray print expected "actor is dead" task errors: drop them
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            local.stop_local()


# -- the command ------------------------------------------------------------------------------
def bench_spec(args: argparse.Namespace) -> DeploymentSpec:
    """The spec both phases serve: --spec (default: the embedded one) with its first model
    only, one replica, --engine, --drafter/--no-drafter (default as `up`), max_num_seqs >=
    the highest concurrency, a GPU per replica when this machine has one, a free port."""
    from agentserve.cli_up import with_default_drafters, with_overrides
    from agentserve.drafters import shipped_drafter
    from agentserve.spec import load_spec, spec_from_dict

    spec = load_spec(args.spec) if args.spec else DeploymentSpec()
    spec, _ = with_default_drafters(spec, args.drafter, shipped_drafter)  # before the dump
    data = spec.model_dump(mode="json")
    data["models"] = data["models"][:1]
    model = data["models"][0]
    model["engine"] = args.engine
    model["max_num_seqs"] = args.max_num_seqs or max(model["max_num_seqs"], *args.concurrency)
    model["replicas"].update(min_replicas=1, max_replicas=1, initial_replicas=None)
    if args.engine == "fake":
        model["replicas"]["num_cpus"] = 0.5
    elif _cuda_available():  # the replica gets the GPU the bare phase uses
        model["replicas"]["num_gpus"] = max(1, model["replicas"]["num_gpus"])
    spec = spec_from_dict(data, source="(bench overhead)")
    return with_overrides(spec, "127.0.0.1", args.port or _free_port())


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # no torch or a broken driver: CPU
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (options left at their defaults omitted)."""
    parts = ["agentserve", "bench", "overhead"]
    if args.spec:
        parts += ["--spec", args.spec]
    if args.engine != "vllm":
        parts += ["--engine", args.engine]
    if args.drafter is not None:
        parts.append("--drafter" if args.drafter else "--no-drafter")
    parts += ["--concurrency", ",".join(map(str, args.concurrency))]
    parts += ["--max-tokens", str(args.max_tokens)]
    if args.rounds != 2:
        parts += ["--rounds", str(args.rounds)]
    if args.max_num_seqs:
        parts += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.engine == "fake":
        parts += ["--fake-step-ms", f"{args.fake_step_ms:g}"]
    return " ".join(shlex.quote(a) for a in parts)


def run(args: argparse.Namespace, *, platform_runner: PlatformRunner = platform_phase) -> int:
    """The benchmark; `platform_runner` serves the platform phase (tests swap in one
    without Ray)."""
    from agentserve.bench.report import replace_section
    from agentserve.engine.vllm import speculative_config

    if args.max_tokens < 2:
        raise SystemExit("--max-tokens must be >= 2 (TPOT needs two tokens)")
    spec = bench_spec(args)
    model = spec.models[0]
    plan = Plan(PROMPTS, tuple(args.concurrency), args.max_tokens, args.rounds)
    drafter = speculative_config(model) if model.engine == "vllm" else None
    started = time.perf_counter()
    print(
        f"platform overhead: {model.name} on {model.engine}, drafter "
        f"{drafter['model'] if drafter else 'off'}, concurrency {list(plan.concurrency)}, "
        f"{plan.max_tokens} tokens per request",
        flush=True,
    )
    if model.engine == "fake":
        from agentserve.engine.fake import FakeEngineFactory

        factory: Any = FakeEngineFactory(token_delay_s=args.fake_step_ms / 1000, accept_per_step=1)
        bare = bare_fake(model, factory, plan)
    else:
        from agentserve.models import resolve_model
        from agentserve.serve.replica import default_engine_factory

        factory = default_engine_factory
        bare = bare_vllm(model, str(resolve_model(model.source, progress=True)), plan)
    platform = platform_runner(spec, factory, plan, args.start_timeout_s)
    levels = compare_levels(bare, platform)
    report = {
        "command": command_line(args),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{host.machine()}, {os.cpu_count()} CPUs",
        "gpu": _gpu_name(),
        "engine": model.engine,
        "model": model.name,
        "drafter": drafter["model"] if drafter else None,
        "num_speculative_tokens": drafter["num_speculative_tokens"] if drafter else 0,
        "max_num_seqs": model.max_num_seqs,
        "max_tokens": plan.max_tokens,
        "prompts": len(plan.prompts),
        "bare": "in-process: vLLM AsyncLLM.generate on chat-templated token ids"
        if model.engine == "vllm"
        else "in-process: FakeEngine through the Engine protocol",
        "platform": "HTTP + Ray Serve (the `agentserve up` app on local Ray), streamed "
        "/v1/chat/completions via httpx",
        "definitions": {
            "tpot_ms": "mean over requests of (last - first output time) / (tokens - 1)",
            "tokens_per_s": "output tokens of the level / its wall time",
            "overhead_ratio": "platform tpot_ms / bare tpot_ms",
            "throughput_ratio": "platform tokens_per_s / bare tokens_per_s",
        },
        "levels": levels,
        "target": verdict(levels),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    docs = Path(args.docs)
    # --no-drafter is a side measurement: its own file and section, beside the default's
    variant = "_no_drafter" if args.drafter is False else ""
    report["json"] = JSON_NAME.replace(".json", f"{variant}.json")
    out = docs / "benchmarks" / report["json"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown_table(levels)
    section = SECTION + variant.replace("_", "-")
    replace_section(docs / "benchmarks.md", section, _section(report, table))
    print(table)
    print(json.dumps({"written": [str(out), str(docs / "benchmarks.md")]}))
    return 0


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # no torch or a broken driver: report no GPU
        return None


def _section(report: dict[str, Any], table: str) -> str:
    target = report["target"]
    met = "met" if target["met"] else "**not met**"
    scaling = ", ".join(
        f"c={c}: {fmt_number(r, 2)}x" for c, r in target["platform_throughput_scaling"].items()
    )
    return (
        "## Platform overhead (HTTP + Ray Serve vs the bare engine"
        f"{', no drafter' if report['json'] != JSON_NAME else ''})\n\n"
        f"Command: `{report['command']}` ({report['date']}, {report['machine']}"
        f"{', ' + report['gpu'] if report['gpu'] else ''}; engine {report['engine']}, model "
        f"{report['model']}, drafter {report['drafter'] or 'off'}; {report['max_tokens']} "
        f"output tokens per request, greedy, ignore_eos; {report['wall_s']:.0f} s). Raw "
        f"figures: `benchmarks/{report['json']}`.\n\n"
        f"Bare: {report['bare']}. Platform: {report['platform']}. Both phases run one after "
        "the other with the same engine settings. Overhead ratio = platform TPOT / bare TPOT; "
        "throughput ratio = platform tokens/s / bare tokens/s.\n\n"
        f"{table}\n"
        f"Target (at most {target['max_overhead']:.0%} overhead at concurrency "
        f"{target['at_concurrency']}): {met}. Platform throughput relative to concurrency "
        f"{target['at_concurrency']}: {scaling}.\n"
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "overhead",
        help="bare engine vs HTTP + Ray Serve: TPOT and tokens/s at each concurrency",
        description="Runs the same prompts through the bare engine in-process, then through "
        "the app `agentserve up` serves (HTTP + Ray Serve), at each concurrency; writes "
        f"docs/benchmarks/{JSON_NAME} and a section in docs/benchmarks.md.",
    )
    p.add_argument("--spec", help="DeploymentSpec file (default: the embedded deployment)")
    p.add_argument(
        "--engine", choices=("vllm", "fake"), default="vllm", help="(default: %(default)s)"
    )
    p.add_argument(
        "--drafter",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DFlash drafter on/off (default: as `agentserve up`: the shipped drafter)",
    )
    p.add_argument(
        "--concurrency", type=_ints, default=[1, 4, 16], help="comma list (default: 1,4,16)"
    )
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="requests per level = max(8, rounds x concurrency) (default: %(default)s)",
    )
    p.add_argument("--max-num-seqs", type=int, help="engine batch (default: >= max concurrency)")
    p.add_argument("--port", type=int, help="HTTP port of the platform phase (default: free)")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument(
        "--fake-step-ms", type=float, default=20.0, help="fake engine step time (default: 20)"
    )
    p.add_argument("--docs", default="docs", help="where benchmarks.md lives (default: docs)")
    p.set_defaults(handler=run)

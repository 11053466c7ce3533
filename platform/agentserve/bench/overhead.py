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
import itertools
import json
import os
import platform as host
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from agentserve.spec import DeploymentSpec, ModelSpec

__all__ = ["PROMPTS", "RequestTiming", "add_parser", "compare_levels", "level_stats", "run"]

TARGET_OVERHEAD = 0.05  # issue: the platform adds <= 5% at concurrency 1
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


@dataclass(frozen=True)
class RequestTiming:
    """One request as the caller saw it (perf_counter seconds). `first_s` / `last_s`: the
    first and last chunk carrying output; None when no output arrived."""

    start_s: float
    first_s: float | None
    last_s: float | None
    output_tokens: int
    prompt_tokens: int

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_s is None else 1000 * (self.first_s - self.start_s)

    @property
    def tpot_ms(self) -> float | None:
        """Per output token after the first; None below two tokens."""
        if self.first_s is None or self.last_s is None or self.output_tokens < 2:
            return None
        return 1000 * (self.last_s - self.first_s) / (self.output_tokens - 1)


OneRequest = Callable[[str, str], Awaitable[RequestTiming]]
"""(request id, prompt text) -> the request's timing; generates max_tokens tokens."""


# -- load and statistics (pure except for the clock) ------------------------------------------
async def run_level(
    one: OneRequest, prompts: Sequence[str], concurrency: int, requests: int, tag: str
) -> tuple[list[RequestTiming], float]:
    """`requests` requests, `concurrency` at a time, prompts in turn; (timings, wall s)."""
    counter = itertools.count()
    timings: list[RequestTiming] = []

    async def worker() -> None:
        while (i := next(counter)) < requests:
            timings.append(await one(f"{tag}-{i}", prompts[i % len(prompts)]))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return timings, time.perf_counter() - start


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


def level_stats(timings: Sequence[RequestTiming], wall_s: float) -> dict[str, Any]:
    """Figures of one phase at one concurrency: tokens/s over the wall time, TPOT and TTFT
    (mean, p50, p95 over requests), token totals."""
    tpot = [t.tpot_ms for t in timings if t.tpot_ms is not None]
    ttft = [t.ttft_ms for t in timings if t.ttft_ms is not None]
    tokens = sum(t.output_tokens for t in timings)
    return {
        "requests": len(timings),
        "output_tokens": tokens,
        "prompt_tokens": sum(t.prompt_tokens for t in timings),
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "tpot_ms": _round(np.mean(tpot)) if tpot else None,
        "tpot_ms_p50": _round(np.percentile(tpot, 50)) if tpot else None,
        "tpot_ms_p95": _round(np.percentile(tpot, 95)) if tpot else None,
        "ttft_ms": _round(np.mean(ttft)) if ttft else None,
        "ttft_ms_p95": _round(np.percentile(ttft, 95)) if ttft else None,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def compare_levels(
    bare: dict[int, dict[str, Any]], platform: dict[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per concurrency: both phases' figures, overhead_ratio (platform / bare mean TPOT),
    throughput_ratio (platform / bare tokens/s), and whether both generated the same
    prompt and output token counts."""
    levels = []
    for c in sorted(bare):
        b, p = bare[c], platform[c]
        levels.append(
            {
                "concurrency": c,
                "bare": b,
                "platform": p,
                "overhead_ratio": _ratio(p["tpot_ms"], b["tpot_ms"]),
                "throughput_ratio": _ratio(p["tokens_per_s"], b["tokens_per_s"]),
                "same_tokens": (b["output_tokens"], b["prompt_tokens"])
                == (p["output_tokens"], p["prompt_tokens"]),
            }
        )
    return levels


def verdict(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's target: <= 5% overhead at the lowest concurrency (per token and in
    throughput), and platform throughput at each level relative to the lowest."""
    first = levels[0]
    over, thr = first["overhead_ratio"], first["throughput_ratio"]
    met = over is not None and thr is not None
    met = met and over <= 1 + TARGET_OVERHEAD and thr >= 1 / (1 + TARGET_OVERHEAD)
    base = first["platform"]["tokens_per_s"]
    return {
        "max_overhead": TARGET_OVERHEAD,
        "at_concurrency": first["concurrency"],
        "met": bool(met),
        "platform_throughput_scaling": {
            str(lv["concurrency"]): _ratio(lv["platform"]["tokens_per_s"], base) for lv in levels
        },
    }


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(levels: list[dict[str, Any]]) -> str:
    head = (
        "| concurrency | bare tok/s | platform tok/s | throughput ratio | bare TPOT ms "
        "| platform TPOT ms | overhead ratio | bare TTFT ms | platform TTFT ms | same tokens |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for lv in levels:
        b, p = lv["bare"], lv["platform"]
        cells = [lv["concurrency"], _fmt(b["tokens_per_s"], 1), _fmt(p["tokens_per_s"], 1)]
        cells += [_fmt(lv["throughput_ratio"], 3), _fmt(b["tpot_ms"], 2), _fmt(p["tpot_ms"], 2)]
        cells += [_fmt(lv["overhead_ratio"], 3), _fmt(b["ttft_ms"], 1), _fmt(p["ttft_ms"], 1)]
        cells.append("yes" if lv["same_tokens"] else "**no**")
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return head + "\n".join(rows) + "\n"


# -- one request, three ways ------------------------------------------------------------------
def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The OpenAI request both sides serve: greedy, fixed length, streamed with usage."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,  # vLLM's extension: every request generates max_tokens
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def engine_request_fn(engine: Any, model: str, max_tokens: int) -> OneRequest:
    """Bare side through the Engine protocol (the fake engine): parsed like the ingress
    parses, deltas carry cumulative token counts."""
    from agentserve.api.openai import parse_request
    from agentserve.engine.protocol import EngineRequest

    async def one(request_id: str, prompt: str) -> RequestTiming:
        body = parse_request("chat", chat_body(model, prompt, max_tokens))
        start = time.perf_counter()
        first = last = None
        tokens = prompt_tokens = 0
        async for delta in engine.generate(EngineRequest(request_id, "chat", body)):
            if delta.completion_tokens > tokens:
                last = time.perf_counter()
                first = first or last
            tokens, prompt_tokens = delta.completion_tokens, delta.prompt_tokens
        return RequestTiming(start, first, last, tokens, prompt_tokens)

    return one


def prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of one user message as vLLM's chat serving renders it: the chat template
    as text with the generation prompt, tokenized without extra special tokens."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def async_llm_request_fn(llm: Any, tokenizer: Any, max_tokens: int) -> OneRequest:
    """Bare side on vLLM: AsyncLLM.generate on the chat template's token ids (what vLLM's
    chat serving renders), greedy, ignore_eos, delta outputs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )

    async def one(request_id: str, prompt: str) -> RequestTiming:
        ids = prompt_ids(tokenizer, prompt)
        start = time.perf_counter()
        first = last = None
        tokens = 0
        async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, request_id):
            new = len(out.outputs[0].token_ids)
            if new:
                last = time.perf_counter()
                first = first or last
                tokens += new
        return RequestTiming(start, first, last, tokens, len(ids))

    return one


def http_request_fn(client: Any, model: str, max_tokens: int) -> OneRequest:
    """Platform side: a streamed POST /v1/chat/completions; output times are the chunks
    carrying content, token counts come from the final usage chunk."""

    async def one(request_id: str, prompt: str) -> RequestTiming:
        body = chat_body(model, prompt, max_tokens)
        start = time.perf_counter()
        first = last = None
        usage: dict[str, int] = {}
        headers = {"x-request-id": request_id}
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                choices = chunk.get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    last = time.perf_counter()
                    first = first or last
                usage = chunk.get("usage") or usage
        return RequestTiming(
            start, first, last, usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0)
        )

    return one


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
    out = docs / "benchmarks" / JSON_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown_table(levels)
    replace_section(docs / "benchmarks.md", SECTION, _section(report, table))
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
        f"c={c}: {_fmt(r, 2)}x" for c, r in target["platform_throughput_scaling"].items()
    )
    return (
        "## Platform overhead (HTTP + Ray Serve vs the bare engine)\n\n"
        f"Command: `{report['command']}` ({report['date']}, {report['machine']}"
        f"{', ' + report['gpu'] if report['gpu'] else ''}; engine {report['engine']}, model "
        f"{report['model']}, drafter {report['drafter'] or 'off'}; {report['max_tokens']} "
        f"output tokens per request, greedy, ignore_eos; {report['wall_s']:.0f} s). Raw "
        f"figures: `benchmarks/{JSON_NAME}`.\n\n"
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

"""`agentserve bench overhead`: what agentserve's serving path costs against what a user
would serve with instead, and against the bare engine.

The same prompts, greedy with a fixed output length (ignore_eos), streamed, go through each
system in turn, one at a time, at each concurrency (overhead_phases.py):
"bare" (vLLM's AsyncLLM.generate on chat-templated token ids, started by VLLMEngine exactly
as a replica starts it, in a spawned process; for the fake engine, the FakeEngine through
the Engine protocol), "vllm_serve" (vLLM's own OpenAI server with the same engine
arguments) and "agentserve" (the app `agentserve up` serves: HTTP, ingress, Ray Serve
handle, replica). Per request: TTFT, and TPOT = (last token time - first token time) /
(output tokens - 1), measured at the caller; per level: tokens/s = output tokens / wall
time. Ratios are to vllm_serve when it ran, else to bare. "ray_serve_llm" (Ray Serve LLM's
build_openai_app, one LLMServer replica, the same engine arguments) runs when its overlay is
installed (rayllm_env.py); without it the default skips it and says why.
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from agentserve.drafters import shipped_drafter
from agentserve.engine.vllm_args import speculative_config
from agentserve.serve.replica import default_engine_factory
from agentserve.sources.models import resolve_model
from agentserve.spec import DeploymentSpec, load_spec, spec_from_dict
from agentserve.spec.defaults import with_default_drafters
from agentserve.spec.overrides import with_overrides

from agentserve_bench.arg_types import ints
from agentserve_bench.fake_engine import FakeEngineFactory
from agentserve_bench.overhead_phases import (
    Plan,
    PlatformRunner,
    bare_fake,
    bare_vllm,
    cuda_available,
    free_port,
    http_levels,
    platform_phase,
    ray_serve_llm_phase,
    vllm_serve_phase,
)
from agentserve_bench.overhead_stats import (
    RequestTiming,
    compare_systems,
    fmt_number,
    level_stats,
    markdown_table,
    verdict,
)
from agentserve_bench.rayllm_env import problem as rayllm_problem
from agentserve_bench.report import default_docs, replace_section

__all__ = [
    "PROMPTS",
    "SYSTEMS",
    "Plan",
    "RequestTiming",
    "add_parser",
    "compare_systems",
    "http_levels",
    "level_stats",
    "run",
]

JSON_NAME = "platform_overhead.json"
SECTION = "platform-overhead"
SYSTEMS = ("bare", "vllm_serve", "ray_serve_llm", "agentserve")  # in the order they run
PEERS = ("vllm_serve", "ray_serve_llm")  # servers a user would run instead: vLLM only
DESCRIBED = {
    "bare": "in-process: vLLM AsyncLLM.generate on chat-templated token ids",
    "bare_fake": "in-process: FakeEngine through the Engine protocol",
    "vllm_serve": "vLLM's own OpenAI server (python -m vllm.entrypoints.openai.api_server) "
    "with the replica's engine arguments, streamed /v1/chat/completions via httpx",
    "ray_serve_llm": "Ray Serve LLM (ray.serve.llm.build_openai_app, one LLMServer replica, "
    "its own local Ray cluster) with the replica's engine arguments, streamed "
    "/v1/chat/completions via httpx",
    "agentserve": "HTTP + Ray Serve (the `agentserve up` app on local Ray), streamed "
    "/v1/chat/completions via httpx",
}
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


# -- the command ------------------------------------------------------------------------------
def bench_spec(args: argparse.Namespace) -> DeploymentSpec:
    """The spec both phases serve: --spec (default: the embedded one) with its first model
    only, one replica, --engine, --drafter/--no-drafter (default as `up`), max_num_seqs >=
    the highest concurrency, a GPU per replica when this machine has one, a free port."""

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
    elif cuda_available():  # the replica gets the GPU the bare phase uses
        model["replicas"]["num_gpus"] = max(1, model["replicas"]["num_gpus"])
    spec = spec_from_dict(data, source="(bench overhead)")
    return with_overrides(spec, "127.0.0.1", args.port or free_port())


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
    if args.systems:
        parts += ["--systems", ",".join(args.systems)]
    return " ".join(shlex.quote(a) for a in parts)


def systems_to_run(
    args: argparse.Namespace, rayllm_problem: str | None = None
) -> tuple[tuple[str, ...], str | None]:
    """--systems in run order, and why a default system is left out (None when none is).

    Default: all four on vLLM, less ray_serve_llm when `rayllm_problem` says why it cannot
    run here; bare and agentserve on fake. Asking for ray_serve_llm when it cannot run is
    an error that says why."""
    skipped = None
    if args.systems:
        wanted = args.systems
    elif args.engine != "vllm":
        wanted = ("bare", "agentserve")
    else:
        wanted = SYSTEMS
        if rayllm_problem:
            wanted = tuple(s for s in SYSTEMS if s != "ray_serve_llm")
            skipped = f"ray_serve_llm skipped: {rayllm_problem}"
    unknown = sorted(set(wanted) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}")
    for peer in PEERS:
        if peer in wanted and args.engine != "vllm":
            raise SystemExit(f"--systems {peer} needs --engine vllm")
    if "ray_serve_llm" in wanted and rayllm_problem:
        raise SystemExit(f"--systems ray_serve_llm: {rayllm_problem}")
    return tuple(s for s in SYSTEMS if s in wanted), skipped


def run(
    args: argparse.Namespace,
    *,
    platform_runner: PlatformRunner = platform_phase,
    peer_runner: Any = vllm_serve_phase,
    rayllm_runner: Any = ray_serve_llm_phase,
    rayllm_check: Any = rayllm_problem,
) -> int:
    """The benchmark; `platform_runner` / `peer_runner` / `rayllm_runner` serve the
    agentserve / vllm_serve / ray_serve_llm phases, `rayllm_check` says why Ray Serve LLM
    cannot run (tests swap in ones without Ray or vLLM)."""

    if args.max_tokens < 2:
        raise SystemExit("--max-tokens must be >= 2 (TPOT needs two tokens)")
    systems, skipped = systems_to_run(args, rayllm_check() if args.engine == "vllm" else None)
    if skipped:
        print(skipped, flush=True)
    spec = bench_spec(args)
    model = spec.models[0]
    plan = Plan(PROMPTS, tuple(args.concurrency), args.max_tokens, args.rounds)
    drafter = speculative_config(model) if model.engine == "vllm" else None
    started = time.perf_counter()
    print(
        f"platform overhead: {model.name} on {model.engine}, drafter "
        f"{drafter['model'] if drafter else 'off'}, systems {', '.join(systems)}, "
        f"concurrency {list(plan.concurrency)}, {plan.max_tokens} tokens per request",
        flush=True,
    )
    figures: dict[str, dict[int, dict[str, Any]]] = {}
    rayllm_settings: dict[str, Any] | None = None
    if model.engine == "fake":
        factory: Any = FakeEngineFactory(token_delay_s=args.fake_step_ms / 1000, accept_per_step=1)
        if "bare" in systems:
            figures["bare"] = bare_fake(model, factory, plan)
    else:
        factory = default_engine_factory
        model_dir = str(resolve_model(model.source, progress=True))
        if "bare" in systems:
            figures["bare"] = bare_vllm(model, model_dir, plan)
        if "vllm_serve" in systems:
            with tempfile.TemporaryDirectory(prefix="bench-vllm-serve-") as logs:
                figures["vllm_serve"] = peer_runner(
                    model, model_dir, plan, args.start_timeout_s, Path(logs)
                )
        if "ray_serve_llm" in systems:
            with tempfile.TemporaryDirectory(prefix="bench-ray-serve-llm-") as logs:
                try:
                    figures["ray_serve_llm"], rayllm_settings = rayllm_runner(
                        model, model_dir, plan, args.start_timeout_s, Path(logs)
                    )
                except (RuntimeError, TimeoutError) as exc:  # the peer, not the run, failed
                    skipped = f"ray_serve_llm could not run: {_last_lines(str(exc))}"
                    print(skipped, flush=True)
    if "agentserve" in systems:
        figures["agentserve"] = platform_runner(spec, factory, plan, args.start_timeout_s)
    reference = "vllm_serve" if "vllm_serve" in figures else next(iter(figures))
    levels = compare_systems(figures, reference)
    bare_kind = "bare" if model.engine == "vllm" else "bare_fake"
    report = {
        "command": command_line(args),
        "date": time.strftime("%Y-%m-%d"),
        "machine": _machine(),
        "gpu": _gpu_name(),
        "engine": model.engine,
        "model": model.name,
        "drafter": drafter["model"] if drafter else None,
        "num_speculative_tokens": drafter["num_speculative_tokens"] if drafter else 0,
        "max_num_seqs": model.max_num_seqs,
        "max_tokens": plan.max_tokens,
        "prompts": len(plan.prompts),
        "systems": {s: DESCRIBED[bare_kind if s == "bare" else s] for s in figures},
        "reference": reference,
        "skipped": skipped,
        "ray_serve_llm": rayllm_settings,
        "definitions": {
            "tpot_ms": "mean over requests of (last - first output time) / (tokens - 1)",
            "tokens_per_s": "output tokens of the level / its wall time",
            "tpot_ratio": f"a system's tpot_ms / {reference}'s",
            "throughput_ratio": f"a system's tokens_per_s / {reference}'s",
        },
        "levels": levels,
        "target": verdict(levels, reference, "agentserve") if "agentserve" in figures else None,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    docs = Path(args.docs)
    # --no-drafter is a side measurement: its own file and section, beside the default's
    variant = "_no_drafter" if args.drafter is False else ""
    report["json"] = JSON_NAME.replace(".json", f"{variant}.json")
    out = docs / "benchmarks" / report["json"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown_table(levels, reference)
    section = SECTION + variant.replace("_", "-")
    replace_section(docs / "benchmarks.md", section, _section(report, table))
    print(table)
    print(json.dumps({"written": [str(out), str(docs / "benchmarks.md")]}))
    return 0


def _last_lines(text: str, n: int = 8) -> str:
    """The error's first line and its last `n` (a server log's tail ends with the cause)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines if len(lines) <= n + 1 else [lines[0], "...", *lines[-n:]])


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # no torch or a broken driver: report no GPU
        return None


def _section(report: dict[str, Any], table: str) -> str:
    target = report["target"]
    systems = "; ".join(f"**{name}**: {what}" for name, what in report["systems"].items())
    verdict_line = ""
    if target is not None:
        met = "met" if target["met"] else "**not met**"
        scaling = ", ".join(
            f"c={c}: {fmt_number(r, 2)}x" for c, r in target["throughput_scaling"].items()
        )
        levels = report["levels"]
        verdict_line = (
            f"Target for agentserve against {target['reference']} (TPOT at most "
            f"{target['max_tpot_ratio']:.2f}x at concurrency {levels[0]['concurrency']}, "
            f"throughput at least {target['min_throughput_ratio']:.2f}x at "
            f"{levels[-1]['concurrency']}): {met} ({fmt_number(target['tpot_ratio_at_lowest'], 3)}"
            f"x, {fmt_number(target['throughput_ratio_at_highest'], 3)}x). agentserve "
            f"throughput relative to concurrency {levels[0]['concurrency']}: {scaling}.\n"
        )
    notes = ""
    if report.get("ray_serve_llm"):
        r = report["ray_serve_llm"]
        notes += (
            f"Ray Serve LLM ran with ray {r.get('ray')}, vLLM {r.get('vllm')}, on "
            f"{r.get('accelerator')}, stream batching {r.get('stream_batching_interval_ms')} ms "
            "(its default: LLMServer yields what vLLM produced every interval).\n\n"
        )
    if report.get("skipped"):
        notes += f"{report['skipped']}.\n\n"
    return (
        "## Platform overhead (agentserve vs vLLM's own server and the bare engine"
        f"{', no drafter' if report['json'] != JSON_NAME else ''})\n\n"
        f"Command: `{report['command']}` ({report['date']}, {report['machine']}"
        f"{', ' + report['gpu'] if report['gpu'] else ''}; engine {report['engine']}, model "
        f"{report['model']}, drafter {report['drafter'] or 'off'}; {report['max_tokens']} "
        f"output tokens per request, greedy, ignore_eos; {report['wall_s']:.0f} s). Raw "
        f"figures: `benchmarks/{report['json']}`.\n\n"
        f"Systems, one at a time with the same engine settings: {systems}. Ratios are to "
        f"{report['reference']}.\n\n{notes}"
        f"{table}\n{verdict_line}"
    )


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "overhead",
        help="agentserve vs vLLM's own server, Ray Serve LLM and the bare engine: TPOT, "
        "TTFT, tokens/s",
        description="Runs the same prompts through the bare engine in-process, vLLM's own "
        "OpenAI server, Ray Serve LLM and the app `agentserve up` serves (HTTP + Ray "
        "Serve), one after the other, at each concurrency; writes docs/benchmarks/"
        f"{JSON_NAME} and a section in docs/benchmarks.md.",
    )
    p.add_argument("--spec", help="DeploymentSpec file (default: the embedded deployment)")
    p.add_argument(
        "--engine", choices=("vllm", "fake"), default="vllm", help="(default: %(default)s)"
    )
    p.add_argument(
        "--drafter",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DFlash drafter on/off (default: the spec's drafter; for the bundled model DFlash "
        "with the shipped drafter, not `agentserve up`'s per-CPU default method)",
    )
    p.add_argument(
        "--concurrency", type=ints, default=[1, 4, 16], help="comma list (default: 1,4,16)"
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
    p.add_argument(
        "--systems",
        type=lambda text: tuple(x for x in text.split(",") if x),
        help=f"comma list of {', '.join(SYSTEMS)} (default: all four with --engine vllm, "
        "less ray_serve_llm without its overlay (python -m agentserve_bench.rayllm_env "
        "--install); bare,agentserve with fake)",
    )
    p.add_argument(
        "--docs",
        type=Path,
        default=default_docs(),
        help="where benchmarks.md lives (default: %(default)s)",
    )
    p.set_defaults(handler=run)


def _machine() -> str:  # the CPU the figures hold for: model, cores, features, kind
    from agentserve.engine.cpu_info import read_cpu_info

    return f"{read_cpu_info().describe()}; class {read_cpu_info().cpu_class}"

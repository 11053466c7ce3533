"""`agentserve bench speculative`: DFlash vs no speculation vs n-gram (vs suffix), one run.

Through vLLM (one engine per method, each in its own process) and optionally the dflash
reference loop, on held-out prompts (HumanEval + agent/code prompts from held-out
packages), at temperature 0 and 1, batch 1 and 4, plus a float32 pass that checks greedy
DFlash output is token-identical to plain decoding when kernels are not the question.
Reports tokens/s, speedup over no speculation, tau (tokens per step), its histogram,
per-position acceptance, and whether greedy outputs equal the baseline.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from agentserve.engine.vllm_args import hybrid_config, spec_decode_counters, speculative_config
from agentserve.spec import DeploymentSpec
from agentserve.speculation.hybrid_drafter import CONFIG_KEY as HYBRID_CONFIG_KEY
from agentserve.speculation.hybrid_drafter import (
    STATS_INTERVAL_S,
    proposer_rows,
    read_stats,
    with_stats_path,
)
from agentserve.speculation.schedule import with_speculation_schedule

from dflash.train.responses import cpu_engine_env

__all__ = [
    "VLLM_METHODS",
    "histogram_from_positions",
    "llm_speculation",
    "method_speculative_config",
    "reference_runs",
    "shutdown_offline",
    "vllm_runs",
]

VLLM_METHODS: list[tuple[str, int]] = [("none", 0), ("dflash", 4), ("ngram", 4)]  # block 5: k <= 4
MAX_MODEL_LEN = 2048  # held-out agent prompts run to ~1.2K tokens


def histogram_from_positions(drafts: int, accepted_per_pos: list[int]) -> dict[int, int]:
    """Tokens-per-step histogram from per-position accept counts (acceptance is a prefix)."""
    counts = [drafts, *accepted_per_pos, 0]
    return {
        j + 1: counts[j] - counts[j + 1]
        for j in range(len(counts) - 1)
        if counts[j] - counts[j + 1]
    }


def method_speculative_config(
    method: str,
    k: int,
    model_dir: str,
    drafter_dir: str | None,
    drafter_settings: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """vLLM speculative_config for one benchmark method, built exactly as `agentserve up`
    builds it from a spec (same n-gram window, same drafter checks). "METHOD+schedule" adds
    the autoscaler's per-batch-size speculation schedule (`agentserve spec
    speculation-schedule`), which turns drafting down where the step-cost model says it
    stops paying. `drafter_settings`: more of the spec's drafter fields (a speculating
    method only)."""

    name, scheduled = method.removesuffix("+schedule"), method.endswith("+schedule")
    drafter: dict[str, Any] = {"enabled": name != "none", "num_speculative_tokens": max(k, 1)}
    if name != "none":
        drafter["method"] = name
    if name in ("dflash", "hybrid", "eagle3"):
        drafter["path"] = drafter_dir
    if name == "hybrid":
        drafter["dflash_tokens"] = min(3, max(k, 1))
    if name != "none":
        drafter.update(drafter_settings or {})
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "bench", "source": model_dir, "drafter": drafter}]}
    )
    if scheduled:
        spec = with_speculation_schedule(spec)
    config = speculative_config(spec.models[0])
    hybrid = hybrid_config(spec.models[0])
    return config if hybrid is None or config is None else {**config, **hybrid}


def llm_speculation(config: dict[str, Any] | None) -> dict[str, Any]:
    """vllm.LLM keyword arguments for a `method_speculative_config` result: the hybrid
    settings it carries go to `additional_config` (with async scheduling off, as
    `engine_kwargs` sets it), the rest is the speculative_config."""
    if config is None or HYBRID_CONFIG_KEY not in config:
        return {"speculative_config": config}
    config = dict(config)
    hybrid = {HYBRID_CONFIG_KEY: config.pop(HYBRID_CONFIG_KEY)}
    return {"speculative_config": config, "additional_config": hybrid, "async_scheduling": False}


def _vllm_worker(
    method: str,
    k: int,
    model_dir: str,
    drafter_dir: str,
    prompts: list[list[int]],
    max_tokens: int,
    batch_sizes: list[int],
    temperatures: list[float],
    engine_overrides: dict[str, Any] | None = None,
    dtype: str = "bfloat16",
) -> list[dict[str, Any]]:
    """One engine, all (temperature, batch) cells. Runs in a fresh process.

    `engine_overrides`: more vllm.LLM arguments (tests pass `enforce_eager`, which skips
    the torch.compile warm-up: a 30 s engine start instead of 90-140 s)."""
    from vllm import LLM, SamplingParams

    cpu_engine_env()
    speculation = llm_speculation(method_speculative_config(method, k, model_dir, drafter_dir))
    stats_path = with_stats_path(speculation)  # hybrid: counts per proposer
    llm = LLM(
        model=model_dir,
        dtype=dtype,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=max(batch_sizes),
        seed=0,
        enable_prefix_caching=False,
        disable_log_stats=False,
        **speculation,
        **(engine_overrides or {}),
    )
    try:
        llm.generate(
            [{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=16), use_tqdm=False
        )  # warm-up
        cells = []
        for temperature in temperatures:
            for batch in batch_sizes:
                before = spec_decode_counters(llm.get_metrics())
                proposers_before = proposer_rows(stats_path)
                steps_before = (read_stats(stats_path, "steps") if stats_path else None) or {}
                outputs: list[list[int]] = []
                start = time.perf_counter()
                for i in range(0, len(prompts), batch):
                    chunk = prompts[i : i + batch]
                    params = [
                        SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=i + j)
                        for j in range(len(chunk))
                    ]
                    outs = llm.generate(
                        [{"prompt_token_ids": p} for p in chunk], params, use_tqdm=False
                    )
                    outputs += [list(o.outputs[0].token_ids) for o in outs]
                elapsed = time.perf_counter() - start
                after = spec_decode_counters(llm.get_metrics())
                drafts = after["drafts"] - before["drafts"]
                per_pos = [
                    a - b
                    for a, b in zip(
                        after["accepted_per_pos"],
                        before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"]),
                        strict=True,
                    )
                ]
                accepted = after["accepted_tokens"] - before["accepted_tokens"]
                cells.append(
                    {
                        "engine": "vllm",
                        "dtype": dtype,
                        "method": method,
                        "num_speculative_tokens": k,
                        "temperature": temperature,
                        "batch_size": batch,
                        "tokens": sum(map(len, outputs)),
                        "seconds": round(elapsed, 3),
                        "tokens_per_s": round(sum(map(len, outputs)) / elapsed, 2),
                        "tau": round(1 + accepted / drafts, 3) if drafts else 1.0,
                        "tau_histogram": histogram_from_positions(drafts, per_pos)
                        if drafts
                        else {},
                        "per_position_acceptance": [round(a / drafts, 3) for a in per_pos]
                        if drafts
                        else [],
                        "outputs": outputs,
                    }
                )
                if stats_path:  # the engine writes its counts <= 0.5 s after a step
                    time.sleep(STATS_INTERVAL_S + 0.2)
                    cells[-1]["proposers"] = proposer_delta(
                        proposer_rows(stats_path), proposers_before
                    )
                    steps = read_stats(stats_path, "steps") or {}  # with and without the block
                    cells[-1]["steps"] = {k: n - steps_before.get(k, 0) for k, n in steps.items()}
    finally:
        shutdown_offline(llm)
        if stats_path:
            os.unlink(stats_path)
    return cells


def vllm_runs(
    model_dir: str,
    drafter_dir: str,
    prompts: list[list[int]],
    max_tokens: int,
    batch_sizes: list[int],
    temperatures: list[float],
    methods: list[tuple[str, int]] = VLLM_METHODS,
    engine_overrides: dict[str, Any] | None = None,
    dtype: str = "bfloat16",
) -> list[dict[str, Any]]:
    """Each method in a fresh spawned process (vLLM engines don't share a process well)."""
    cells: list[dict[str, Any]] = []
    for method, k in methods:
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            got = pool.submit(
                _vllm_worker,
                method,
                k,
                model_dir,
                drafter_dir,
                prompts,
                max_tokens,
                batch_sizes,
                temperatures,
                engine_overrides,
                dtype,
            ).result()
        print(
            f"  vllm {dtype} {method} k={k}: done in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        cells += got
    return cells


def proposer_delta(after: tuple, before: tuple) -> dict[str, dict[str, int]]:
    """{proposer: {drafts, drafted_tokens, accepted_tokens}} gained between two
    `proposer_rows` readings."""
    base = {row[0]: row[1:] for row in before}
    return {
        name: dict(
            zip(("drafts", "drafted_tokens", "accepted_tokens"),
                (a - b for a, b in zip(counts, base.get(name, (0, 0, 0)), strict=True)),
                strict=True)
        )
        for name, *counts in after
    }  # fmt: skip


def reference_runs(
    target,
    drafter,
    prompts: list[list[int]],
    max_tokens: int,
    batch_sizes: list[int],
    temperatures: list[float],
    stop_id: int,
) -> list[dict[str, Any]]:
    """The same grid through dflash/generate.py (plain vs DFlash at most 7 and a full block)."""

    from dflash.generate import generate
    from dflash.sampling import SamplingParams

    cells = []
    full = drafter.config.num_draft_tokens
    for name, k in dict.fromkeys((("none", 0), ("dflash", min(7, full)), ("dflash", full))):
        for temperature in temperatures:
            for batch in batch_sizes:
                outputs, lengths, pos, drafted, seconds = [], [], None, 0, 0.0
                for i in range(0, len(prompts), batch):
                    r = generate(
                        target,
                        prompts[i : i + batch],
                        max_tokens,
                        SamplingParams(temperature),
                        drafter=drafter if k else None,
                        num_draft_tokens=k or None,
                        stop_token_ids=[stop_id],
                        seed=i,
                    )
                    outputs += r.tokens
                    lengths += r.stats.acceptance_lengths
                    seconds += r.stats.prefill_s + r.stats.decode_s
                    if k:
                        pos = (
                            r.stats.position_accepted
                            if pos is None
                            else [
                                a + b for a, b in zip(pos, r.stats.position_accepted, strict=True)
                            ]
                        )
                        drafted += r.stats.position_drafted
                tokens = sum(map(len, outputs))
                print(
                    f"  reference {name} k={k} T={temperature:g} batch {batch}: "
                    f"{tokens} tokens in {seconds:.0f} s",
                    flush=True,
                )
                cells.append(
                    {
                        "engine": "reference",
                        "method": name,
                        "num_speculative_tokens": k,
                        "temperature": temperature,
                        "batch_size": batch,
                        "tokens": tokens,
                        "seconds": round(seconds, 3),
                        "tokens_per_s": round(tokens / seconds, 2),
                        "tau": round(sum(lengths) / len(lengths), 3),
                        "tau_histogram": dict(sorted(Counter(lengths).items())),
                        "per_position_acceptance": [round(a / drafted, 3) for a in pos]
                        if pos
                        else [],
                        "outputs": outputs,
                    }
                )
    return cells


def shutdown_offline(llm: Any) -> None:
    """Stop an offline vllm.LLM's engine-core process now.

    Without this, a process that created an LLM can hang at exit: multiprocessing joins
    the non-daemon engine-core child, which is still waiting for work.
    """
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None:
        core.shutdown()

"""Is speculative sampling lossless? Sample the same prompts with and without speculation.

Speculative decoding at temperature > 0 must leave the output distribution unchanged. This
checks it on the output itself, through the real engine (vLLM, one engine per method):
- the histograms of the generated tokens at positions 1..3 (position 1 comes from prefill,
  2 and 3 from rejection sampling) are compared with plain sampling's by a chi-square test
  of homogeneity (rare tokens pooled); `chi2_p_value` is the smallest per-position p-value
  times the number of positions (Bonferroni), so one number says "same distribution";
- the target model itself (transformers, float32) scores every sampled continuation: mean
  log-probability per generated token at temperature 1, which collapses when speculation
  emits tokens the target would not have sampled.
It also replays seeded requests to check that a seed reproduces its completion.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from agentserve.engine.vllm_args import spec_decode_counters
from agentserve.speculation.hybrid_drafter import STATS_INTERVAL_S, proposer_rows, with_stats_path

from agentserve_bench.speculative import llm_speculation, proposer_delta, shutdown_offline
from dflash.train.responses import cpu_engine_env

__all__ = [
    "Setting",
    "homogeneity_chi2",
    "load_scorer",
    "loglik_per_token",
    "parse_setting",
    "position_p_value",
    "sampling_runs",
    "setting_label",
]

CHECK_PROMPTS = [
    "Say hello in five words.",
    "Hello!",
    "Write a Python function that returns the square of a number.",
    "Name three colors and one fruit.",
]
"""Chat prompts sampled by the check (the issue's own reproducers among them)."""

POSITIONS = 3
"""Generated-token positions whose histograms are compared."""

Setting = dict[str, float | int]
"""vLLM SamplingParams fields of one sampled configuration: temperature, top_p, top_k."""


def parse_setting(text: str) -> Setting:
    """`"0.7"` -> temperature 0.7; `"1.0/0.9/20"` -> temperature, top_p and top_k too."""
    parts = text.split("/")
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise ValueError(f"sampling setting {text!r}: expected T, T/top_p or T/top_p/top_k")
    setting: Setting = {"temperature": float(parts[0])}
    if setting["temperature"] <= 0:
        raise ValueError(f"sampling setting {text!r}: the temperature must be > 0")
    if len(parts) > 1:
        setting["top_p"] = float(parts[1])
    if len(parts) > 2:
        setting["top_k"] = int(parts[2])
    return setting


def setting_label(setting: Setting) -> str:
    """The text `parse_setting` reads back: "T" or "T/top_p[/top_k]"."""
    return "/".join(
        f"{setting[key]:g}" for key in ("temperature", "top_p", "top_k") if key in setting
    )


def homogeneity_chi2(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Chi-square test that two samples of categories come from one distribution.

    Categories whose expected count (pooled, either sample) falls under `min_expected` are
    merged into one "other" cell so the chi-square approximation holds. Returns
    (statistic, degrees of freedom, p-value); p = 1.0 when fewer than 2 cells remain.
    """
    import torch

    n_a, n_b = sum(a.values()), sum(b.values())
    if not n_a or not n_b:
        raise ValueError("both samples need at least one observation")
    total = n_a + n_b
    cells: list[tuple[int, int]] = []
    other = [0, 0]
    for key in sorted(set(a) | set(b), key=str):
        pooled = a[key] + b[key]
        if min(n_a, n_b) * pooled / total < min_expected:
            other[0] += a[key]
            other[1] += b[key]
        else:
            cells.append((a[key], b[key]))
    if sum(other):
        cells.append((other[0], other[1]))
    if len(cells) < 2:
        return 0.0, 0, 1.0
    stat = 0.0
    for count_a, count_b in cells:
        pooled = count_a + count_b
        for count, n in ((count_a, n_a), (count_b, n_b)):
            expected = n * pooled / total
            stat += (count - expected) ** 2 / expected
    df = len(cells) - 1
    p = torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2))
    return stat, df, float(p)


def position_p_value(
    outputs: Sequence[Sequence[int]],
    plain: Sequence[Sequence[int]],
    prompt_of: Sequence[int],
    positions: int = POSITIONS,
) -> tuple[float, list[float]]:
    """Bonferroni-combined p-value over generated positions 1..`positions`, per prompt.

    `prompt_of[i]` is the prompt index of `outputs[i]` and of `plain[i]`. Histograms are
    of (prompt, token) pairs, so prompts never mix. Returns (combined p, per-position p).
    """
    per_position = []
    for pos in range(positions):
        a = Counter((p, o[pos]) for p, o in zip(prompt_of, outputs, strict=True) if len(o) > pos)
        b = Counter((p, o[pos]) for p, o in zip(prompt_of, plain, strict=True) if len(o) > pos)
        per_position.append(homogeneity_chi2(a, b)[2])
    return min(1.0, min(per_position) * positions), per_position


def load_scorer(model_dir: str) -> Any:
    """The target model in float32 (transformers), to score sampled continuations."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def loglik_per_token(
    model: Any,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    prompt_of: Sequence[int],
) -> tuple[float, float]:
    """Mean log-probability per generated token under `model` (`load_scorer`), at
    temperature 1. Returns (mean over all tokens, standard error from per-sample means).
    """
    import torch

    totals: list[float] = []
    counts: list[int] = []
    with torch.inference_mode():
        for index, prompt in enumerate(prompts):
            rows = [o for p, o in zip(prompt_of, outputs, strict=True) if p == index and o]
            for start in range(0, len(rows), 16):
                batch = rows[start : start + 16]
                width = max(map(len, batch))
                ids = torch.tensor([list(prompt) + o + [0] * (width - len(o)) for o in batch])
                mask = torch.tensor(
                    [[1] * (len(prompt) + len(o)) + [0] * (width - len(o)) for o in batch]
                )
                logits = model(input_ids=ids, attention_mask=mask).logits.float()
                logp = logits[:, len(prompt) - 1 : -1].log_softmax(-1)  # [B, width, V]
                target = ids[:, len(prompt) :]  # [B, width]
                picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, width]
                for row, o in zip(picked, batch, strict=True):
                    totals.append(float(row[: len(o)].sum()))
                    counts.append(len(o))
    per_sample = torch.tensor([t / c for t, c in zip(totals, counts, strict=True)])
    mean = sum(totals) / sum(counts)
    stderr = float(per_sample.std() / len(per_sample) ** 0.5) if len(per_sample) > 1 else 0.0
    return mean, stderr


def _sampling_worker(
    speculative_config: dict[str, Any] | None,
    model_dir: str,
    prompts: list[list[int]],
    settings: list[Setting],
    samples: int,
    max_tokens: int,
    seed_base: int = 0,
    engine_overrides: dict[str, Any] | None = None,
    replayed: int = 4,
) -> dict[str, Any]:
    """One engine: `samples` seeded continuations per prompt at each temperature, then
    the first `replayed` seeded requests twice more (reproducibility). Runs in a fresh
    process.

    Seeds start at `seed_base`: each method gets its own, so its samples are independent
    of plain sampling's (same seeds would give the same first token, which hides nothing
    but weakens a two-sample test)."""
    from vllm import LLM, SamplingParams

    cpu_engine_env()
    speculation = llm_speculation(speculative_config)
    stats_path = with_stats_path(speculation)  # hybrid: its runner, and a counts file
    engine_args = {
        "model": model_dir,
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "max_num_seqs": 16,
        "seed": 0,
        "enable_prefix_caching": True,
        "disable_log_stats": False,
        **speculation,
    }
    llm = LLM(**{**engine_args, **(engine_overrides or {})})
    try:
        result: dict[str, Any] = {}
        for setting in settings:
            requests = [(p, s) for p in range(len(prompts)) for s in range(samples)]
            params = [
                SamplingParams(**setting, max_tokens=max_tokens, seed=seed_base + 1000 * p + s)
                for p, s in requests
            ]
            inputs = [{"prompt_token_ids": prompts[p]} for p, _ in requests]
            before = spec_decode_counters(llm.get_metrics())
            proposers_before = proposer_rows(stats_path)
            started = time.perf_counter()
            outs = llm.generate(inputs, params, use_tqdm=False)
            seconds = time.perf_counter() - started
            after = spec_decode_counters(llm.get_metrics())
            if stats_path:  # hybrid writes its counts <= 0.5 s after a step
                time.sleep(STATS_INTERVAL_S + 0.2)
            proposers = proposer_delta(proposer_rows(stats_path), proposers_before)
            # a seed reproduces: the same 4 requests, each sent alone, twice. Alone, because
            # a batch's shape changes bf16 numerics (so a near-tie token), and which of a
            # batch's requests reach the engine core's first step depends on timing: under
            # CPU contention a batch of 4 replayed as 1+3 and failed this check
            replays = [
                [
                    llm.generate([i], [p], use_tqdm=False)[0]
                    for i, p in zip(inputs[:replayed], params[:replayed], strict=True)
                ]
                for _ in range(2)
            ]
            first, again = ([list(o.outputs[0].token_ids) for o in r] for r in replays)
            outputs = [list(o.outputs[0].token_ids) for o in outs]
            drafts = after["drafts"] - before["drafts"]
            accepted = after["accepted_tokens"] - before["accepted_tokens"]
            result[setting_label(setting)] = {
                "prompt_of": [p for p, _ in requests],
                "outputs": outputs,
                "replayed_identical": first == again,
                "seconds": round(seconds, 2),
                "tau": round(1 + accepted / drafts, 3) if drafts else 1.0,
                **({"proposers": proposers} if proposers else {}),
            }
        return result
    finally:
        shutdown_offline(llm)
        if stats_path:
            os.unlink(stats_path)


def sampling_runs(
    model_dir: str,
    methods: dict[str, dict[str, Any] | None],
    prompts: list[list[int]],
    settings: list[Setting],
    samples: int,
    max_tokens: int,
    engine_overrides: dict[str, Any] | None = None,
    replayed: int = 4,
) -> dict[str, dict[str, Any]]:
    """{method: {setting label: worker result}}, one spawned engine process per method.

    `engine_overrides`: vllm.LLM arguments over the defaults, e.g. `{"enforce_eager": True}`
    or `{"dtype": "float32"}` (2-5x faster where the CPU has no bf16 instructions);
    `replayed`: how many seeded requests are replayed (alone, twice) per setting."""
    results = {}
    for index, (name, config) in enumerate(methods.items()):
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            results[name] = pool.submit(
                _sampling_worker,
                config,
                model_dir,
                prompts,
                settings,
                samples,
                max_tokens,
                seed_base=1_000_000 * index,
                engine_overrides=engine_overrides,
                replayed=replayed,
            ).result()
        print(f"  sampled {name}: {time.perf_counter() - started:.0f} s", flush=True)
    return results


def distribution_records(
    model_dir: str,
    prompts: list[list[int]],
    results: dict[str, dict[str, Any]],
    settings: list[Setting],
    scored: int = 256,
) -> list[dict[str, Any]]:
    """One `sampling_distribution` record per speculative method and sampling setting,
    each compared with the "none" (plain sampling) results of the same run.

    The chi-square test uses every sample; the log-likelihood scores a seeded subset of
    `scored` samples per method and setting (a float32 forward pass per sample is the
    slow part on a CPU; 256 samples put the standard error near 0.05 nats/token)."""
    records = []
    scorer = load_scorer(model_dir)

    def loglik(outputs: list[list[int]], prompt_of: list[int]) -> tuple[float, float]:
        keep = sorted(random.Random(0).sample(range(len(outputs)), min(scored, len(outputs))))
        picked = [outputs[i] for i in keep], [prompt_of[i] for i in keep]
        return loglik_per_token(scorer, prompts, *picked)

    for setting in settings:
        plain = results["none"][setting_label(setting)]
        prompt_of = plain["prompt_of"]
        plain_ll, plain_se = loglik(plain["outputs"], prompt_of)
        for method, by_setting in results.items():
            if method == "none":
                continue
            run = by_setting[setting_label(setting)]
            p, per_position = position_p_value(run["outputs"], plain["outputs"], prompt_of)
            ll, se = loglik(run["outputs"], prompt_of)
            records.append(
                {
                    "engine": "vllm",
                    "method": method,
                    "test": "sampling_distribution",
                    **setting,
                    "samples": len(run["outputs"]),
                    "loglik_scored_samples": min(scored, len(run["outputs"])),
                    "prompts": len(prompts),
                    "chi2_p_value": round(p, 4),
                    "chi2_p_value_per_position": [round(x, 4) for x in per_position],
                    "loglik_per_token": round(ll, 3),
                    "loglik_per_token_stderr": round(se, 3),
                    "loglik_per_token_plain": round(plain_ll, 3),
                    "loglik_per_token_plain_stderr": round(plain_se, 3),
                    "tau": run["tau"],
                    **({"proposers": run["proposers"]} if "proposers" in run else {}),
                    "seed_reproduces": run["replayed_identical"],
                    "seed_reproduces_plain": plain["replayed_identical"],
                }
            )
    return records

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

import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

__all__ = ["homogeneity_chi2", "loglik_per_token", "position_p_value", "sampling_runs"]

CHECK_PROMPTS = [
    "Say hello in five words.",
    "Hello!",
    "Write a Python function that returns the square of a number.",
    "Name three colors and one fruit.",
]
"""Chat prompts sampled by the check (the issue's own reproducers among them)."""

POSITIONS = 3
"""Generated-token positions whose histograms are compared."""


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


def loglik_per_token(
    model_dir: str,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    prompt_of: Sequence[int],
) -> tuple[float, float]:
    """Mean target log-probability per generated token (float32, temperature 1).

    Returns (mean over all tokens, standard error from per-sample means).
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
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
    temperatures: list[float],
    samples: int,
    max_tokens: int,
) -> dict[str, Any]:
    """One engine: `samples` seeded continuations per prompt at each temperature, then
    the first 4 seeded requests again (reproducibility). Runs in a fresh process."""
    from vllm import LLM, SamplingParams

    from agentserve.engine.vllm import shutdown_offline, spec_decode_counters
    from dflash.train.responses import cpu_engine_env

    cpu_engine_env()
    llm = LLM(
        model=model_dir,
        dtype="bfloat16",
        max_model_len=1024,
        max_num_seqs=16,
        seed=0,
        enable_prefix_caching=True,
        disable_log_stats=False,
        speculative_config=speculative_config,
    )
    try:
        result: dict[str, Any] = {}
        for temperature in temperatures:
            requests = [(p, s) for p in range(len(prompts)) for s in range(samples)]
            params = [
                SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=1000 * p + s)
                for p, s in requests
            ]
            inputs = [{"prompt_token_ids": prompts[p]} for p, _ in requests]
            before = spec_decode_counters(llm.get_metrics())
            started = time.perf_counter()
            outs = llm.generate(inputs, params, use_tqdm=False)
            seconds = time.perf_counter() - started
            after = spec_decode_counters(llm.get_metrics())
            replay = llm.generate(inputs[:4], params[:4], use_tqdm=False)
            outputs = [list(o.outputs[0].token_ids) for o in outs]
            drafts = after["drafts"] - before["drafts"]
            accepted = after["accepted_tokens"] - before["accepted_tokens"]
            result[str(temperature)] = {
                "prompt_of": [p for p, _ in requests],
                "outputs": outputs,
                "replayed_identical": [list(o.outputs[0].token_ids) for o in replay] == outputs[:4],
                "seconds": round(seconds, 2),
                "tau": round(1 + accepted / drafts, 3) if drafts else 1.0,
            }
        return result
    finally:
        shutdown_offline(llm)


def sampling_runs(
    model_dir: str,
    methods: dict[str, dict[str, Any] | None],
    prompts: list[list[int]],
    temperatures: list[float],
    samples: int,
    max_tokens: int,
) -> dict[str, dict[str, Any]]:
    """{method: {str(temperature): worker result}}, one spawned engine process per method."""
    results = {}
    for name, config in methods.items():
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            results[name] = pool.submit(
                _sampling_worker, config, model_dir, prompts, temperatures, samples, max_tokens
            ).result()
        print(f"  sampled {name}: {time.perf_counter() - started:.0f} s", flush=True)
    return results


def distribution_records(
    model_dir: str,
    prompts: list[list[int]],
    results: dict[str, dict[str, Any]],
    temperatures: list[float],
) -> list[dict[str, Any]]:
    """One `sampling_distribution` record per speculative method and temperature, each
    compared with the "none" (plain sampling) results of the same run."""
    records = []
    for temperature in temperatures:
        plain = results["none"][str(temperature)]
        prompt_of = plain["prompt_of"]
        plain_ll, plain_se = loglik_per_token(model_dir, prompts, plain["outputs"], prompt_of)
        for method, by_temperature in results.items():
            if method == "none":
                continue
            run = by_temperature[str(temperature)]
            p, per_position = position_p_value(run["outputs"], plain["outputs"], prompt_of)
            ll, se = loglik_per_token(model_dir, prompts, run["outputs"], prompt_of)
            records.append(
                {
                    "engine": "vllm",
                    "method": method,
                    "test": "sampling_distribution",
                    "temperature": temperature,
                    "samples": len(run["outputs"]),
                    "prompts": len(prompts),
                    "chi2_p_value": round(p, 4),
                    "chi2_p_value_per_position": [round(x, 4) for x in per_position],
                    "loglik_per_token": round(ll, 3),
                    "loglik_per_token_stderr": round(se, 3),
                    "loglik_per_token_plain": round(plain_ll, 3),
                    "loglik_per_token_plain_stderr": round(plain_se, 3),
                    "tau": run["tau"],
                    "seed_reproduces": run["replayed_identical"],
                    "seed_reproduces_plain": plain["replayed_identical"],
                }
            )
    return records

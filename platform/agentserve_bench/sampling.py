"""`agentserve bench sampling`: is speculative sampling lossless through vLLM? One run.

Samples fixed prompts with no speculation, with DFlash and with n-gram at each sampling setting,
then compares the distributions (chi-square on generated positions 1-3) and the target's
log-likelihood per token (sampling_check.py). Writes `sampling_distribution` records
into docs/benchmarks/speculative.json and a section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from agentserve.drafters import shipped_drafter
from agentserve.sources.models import resolve_model

from agentserve_bench.report import default_docs, replace_section, write_json
from agentserve_bench.sampling_check import (
    CHECK_PROMPTS,
    Setting,
    distribution_records,
    parse_setting,
    sampling_runs,
    setting_label,
)
from agentserve_bench.speculative import method_speculative_config
from dflash.train.prompts import chat_prompt_ids

__all__ = ["add_parser", "method_configs", "sampling_table"]


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "sampling",
        help="speculative sampling vs plain sampling: same distribution? (T > 0)",
        description="Samples fixed chat prompts many times with and without speculation "
        "(vLLM, one engine per method) and tests that the output distributions match: a "
        "chi-square test on the generated tokens at positions 1-3 and the target model's "
        "mean log-probability per generated token. Writes `sampling_distribution` records "
        "into docs/benchmarks/speculative.json and a section of docs/benchmarks.md.",
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="bundled model or local HF dir")
    p.add_argument("--drafter", default=None, help="drafter dir (default: the shipped drafter)")
    p.add_argument("--methods", default="dflash,ngram", help="comma list (default: %(default)s)")
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=4,
        help="drafted tokens per step; a DFlash drafter refuses more than its block holds "
        "(default: %(default)s, what the shipped drafter's block of 5 holds)",
    )
    p.add_argument(
        "--settings",
        type=_settings,
        default=_settings(DEFAULT_SETTINGS),
        help="comma list of sampling settings, each T or T/top_p/top_k "
        f"(default: {DEFAULT_SETTINGS})",
    )
    p.add_argument("--samples", type=int, default=200, help="per prompt (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=32, help="per sample (default: %(default)s)")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="the engines' dtype; float32 is 2-5x faster on CPUs without bf16 instructions "
        "(AVX2 only) (default: %(default)s)",
    )
    p.add_argument(
        "--eager",
        action="store_true",
        help="run vLLM without torch.compile (faster engine starts; distributions unchanged)",
    )
    p.add_argument(
        "--work",
        default="runs/bench-sampling",
        help="where the samples are kept for a rerun of the scoring (default: %(default)s)",
    )
    p.add_argument(
        "--docs", type=Path, default=default_docs(), help="docs directory (default: %(default)s)"
    )
    p.set_defaults(handler=_run)


DEFAULT_SETTINGS = "0.7,1.0,1.0/0.9/20"


def _settings(text: str) -> list[Setting]:
    try:
        return [parse_setting(t) for t in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


# hybrid drafts with DFlash in batches of every size here (the spec's default drafts with
# n-gram alone above one request): the check samples in batches, and DFlash's drafts must
# meet the rejection sampler too
EVERY_BATCH = {"dflash_max_batch": None}


def method_configs(
    methods: list[str], model_dir: str, drafter_dir: str | None, k: int
) -> dict[str, dict[str, Any] | None]:
    """vLLM speculative_config per method name; "none" (plain sampling) always first."""

    configs: dict[str, dict[str, Any] | None] = {"none": None}
    for method in methods:
        if method in ("dflash", "hybrid") and drafter_dir is None:
            raise FileNotFoundError("no drafter: pass --drafter or train one")
        configs[method] = method_speculative_config(
            method, k, model_dir, drafter_dir, EVERY_BATCH if method == "hybrid" else None
        )
    return configs


def sampling_table(records: list[dict[str, Any]]) -> str:
    columns = [
        "method",
        "T / top_p / top_k",
        "samples",
        "chi2 p (pos 1-3)",
        "loglik/token",
        "plain",
        "tau",
    ]
    columns += ["seed reproduces"]
    rows = [
        f"| {r['method']} | {setting_label(r)} | {r['samples']} | {r['chi2_p_value']:.3f} | "
        f"{r['loglik_per_token']:.3f} ± {r['loglik_per_token_stderr']:.3f} | "
        f"{r['loglik_per_token_plain']:.3f} ± {r['loglik_per_token_plain_stderr']:.3f} | "
        f"{r['tau']} | {'yes' if r['seed_reproduces'] else 'NO'} |"
        for r in records
    ]
    head = "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|\n"
    return head + "\n".join(rows) + "\n"


def _cached_runs(args, model_dir, configs, prompts, overrides) -> dict[str, Any]:
    """The samples, kept in --work so that a stopped run's scoring can be redone without
    sampling again (the key holds every argument that shapes the samples)."""

    key = json.dumps(
        [configs, prompts, args.settings, args.samples, args.max_tokens, overrides],
        sort_keys=True,
    )
    path = Path(args.work) / "samples.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            print(f"reusing the samples in {path}", flush=True)
            return saved["results"]
    results = sampling_runs(
        model_dir, configs, prompts, args.settings, args.samples, args.max_tokens, overrides
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "results": results}))
    return results


def _run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    model_dir = str(resolve_model(args.model))
    drafter = args.drafter or shipped_drafter(args.model)
    configs = method_configs(
        args.methods.split(","),
        model_dir,
        str(drafter) if drafter else None,
        args.num_speculative_tokens,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [chat_prompt_ids(tokenizer, text) for text in CHECK_PROMPTS]
    started = time.perf_counter()
    labels = [setting_label(s) for s in args.settings]
    print(f"sampling {len(prompts)} prompts x {args.samples} at {labels}", flush=True)
    overrides = {"dtype": args.dtype, **({"enforce_eager": True} if args.eager else {})}
    results = _cached_runs(args, model_dir, configs, prompts, overrides)
    records = [
        {**r, "dtype": args.dtype}
        for r in distribution_records(model_dir, prompts, results, args.settings)
    ]
    docs = Path(args.docs)
    path = docs / "benchmarks" / "speculative.json"
    write_json(records, path, keep=lambda r: r.get("test") != "sampling_distribution")
    command = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    table = sampling_table(records)
    body = (
        "## Speculative sampling is lossless (T > 0, output distribution)\n\n"
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{len(prompts)} chat prompts x {args.samples} seeded samples x {args.max_tokens} "
        f"tokens per method and sampling setting, {args.dtype}, "
        f"{time.perf_counter() - started:.0f} s). "
        "chi2 p: two-sample chi-square test of the generated tokens at positions 1-3 against "
        "plain sampling in the same run (Bonferroni over positions; small p = different "
        "distributions). loglik/token: the target's own mean log-probability (float32, T=1) "
        "of the sampled tokens, ± standard error. Raw figures: `benchmarks/speculative.json` "
        '(records with `"test": "sampling_distribution"`).\n\n'
        f"{table}"
    )
    replace_section(docs / "benchmarks.md", "sampling-distribution", body)
    print(table)
    print(json.dumps({"written": [str(path), str(docs / "benchmarks.md")]}))
    return 0

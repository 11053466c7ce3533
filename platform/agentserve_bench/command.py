"""`agentserve bench ...`: argument parsing and the speculative benchmark's driver.

agentserve's CLI finds this module through the `agentserve.commands` entry point group
(pyproject.toml) and calls `register`; the runtime never imports agentserve_bench itself.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import shlex
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from agentserve.drafters import shipped_drafter
from agentserve.sources.models import resolve_model

from agentserve_bench import (
    affinity,
    calibrate,
    core_slots,
    fit_latency,
    overhead,
    plain_peer,
    ray_idle,
    ray_priority,
    sampling,
    speculative_served,
    startup,
    stream_interval,
)
from agentserve_bench.arg_types import floats, ints
from agentserve_bench.autoscale import bench as autoscale
from agentserve_bench.autoscale import live_bench as autoscale_live
from agentserve_bench.report import (
    default_docs,
    finalize,
    histogram_lines,
    markdown_table,
    plot_speedups,
    replace_section,
    write_json,
)
from agentserve_bench.speculative import reference_runs, vllm_runs
from dflash.train.code_prompts import heldout_context_prompts
from dflash.train.prompts import chat_prompt_ids, humaneval_prompts

__all__ = ["add_parser", "register"]


def register(sub: argparse._SubParsersAction) -> None:
    """The `agentserve.commands` entry point: add `agentserve bench` to the CLI."""
    add_parser(sub)


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print and save measured figures")
    bench.set_defaults(group_parser=bench)  # `agentserve bench` alone: its help, exit 2
    kinds = bench.add_subparsers(title="benchmarks", metavar="BENCH")
    p = kinds.add_parser(
        "speculative",
        help="DFlash vs no speculation vs n-gram (vs suffix), through vLLM, one run",
        description="Runs held-out prompts (HumanEval + agent/code prompts from packages no "
        "training prompt uses) through vLLM with each speculation method at each temperature "
        "and batch size, then a float32 pass (none vs DFlash, greedy) that checks token "
        "identity; writes docs/benchmarks/speculative.json, a table in docs/benchmarks.md and "
        "docs/img/speculative.png.",
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="bundled model or local HF dir")
    p.add_argument("--drafter", default=None, help="drafter dir (default: the shipped drafter)")
    p.add_argument(
        "--num-prompts",
        type=int,
        default=32,
        help="held-out prompts: half HumanEval, half agent/code prompts built from held-out "
        "packages (default: %(default)s)",
    )
    p.add_argument(
        "--methods",
        default="none,dflash:4,dflash+schedule:4,ngram:4,suffix:4",
        help="comma list of METHOD[:k]; METHOD+schedule adds the autoscaler's per-batch-size "
        "speculation schedule; suffix is skipped when arctic-inference is not installed "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--identity-dtype",
        default="float32",
        help="dtype of the greedy identity pass (none vs dflash); '' skips it "
        "(default: %(default)s)",
    )
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: %(default)s)")
    p.add_argument("--batch-sizes", type=ints, default=[1, 4], help="comma list (default: 1,4)")
    p.add_argument(
        "--temperatures", type=floats, default=[0.0, 1.0], help="comma list (default: 0,1)"
    )
    p.add_argument(
        "--engines",
        default="vllm",
        help="comma list of vllm, reference (the dflash/generate.py loop) (default: %(default)s)",
    )
    p.add_argument(
        "--docs",
        type=Path,
        default=default_docs(),
        help="where benchmarks.md, benchmarks/ and img/ live (default: %(default)s)",
    )
    p.set_defaults(handler=_run_speculative)
    sampling.add_parser(kinds)
    autoscale.add_parser(kinds)
    autoscale_live.add_parser(kinds)
    overhead.add_parser(kinds)
    speculative_served.add_parser(kinds)
    startup.add_parser(kinds)
    ray_priority.add_parser(kinds)
    ray_idle.add_parser(kinds)
    plain_peer.add_parser(kinds)
    stream_interval.add_parser(kinds)
    calibrate.add_parser(kinds)
    fit_latency.add_parser(kinds)
    affinity.add_parser(kinds)
    core_slots.add_parser(kinds)


def _heldout_ids(tokenizer, n: int) -> list[list[int]]:
    picked = humaneval_prompts()[: n - n // 2] + heldout_context_prompts(n // 2)
    return [chat_prompt_ids(tokenizer, p.chat()) for p in picked]


def _methods(text: str) -> list[tuple[str, int]]:
    methods = []
    for item in text.split(","):
        name, _, k = item.partition(":")
        if name.startswith("suffix") and find_spec("arctic_inference") is None:
            print("suffix: skipped (arctic-inference is not installed)", flush=True)
            continue
        methods.append((name, 0 if name == "none" else int(k or 7)))
    return methods


def _run_speculative(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    model_dir = resolve_model(args.model)
    drafter_dir = args.drafter or shipped_drafter(args.model)
    if drafter_dir is None:
        raise FileNotFoundError(
            "no drafter: pass --drafter or train one with `agentserve train-drafter`"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = _heldout_ids(tokenizer, args.num_prompts)
    engines = args.engines.split(",")
    started = time.perf_counter()
    cells = []
    if "vllm" in engines:
        print(
            f"vLLM: {len(prompts)} prompts x {args.temperatures} x batch {args.batch_sizes}",
            flush=True,
        )
        methods = _methods(args.methods)
        runs = functools.partial(
            vllm_runs, str(model_dir), str(drafter_dir), prompts, args.max_tokens, args.batch_sizes
        )
        cells += runs(args.temperatures, methods=methods)
        if args.identity_dtype:
            k = next((k for m, k in methods if m.startswith("dflash")), 7)
            print(f"vLLM {args.identity_dtype}: greedy identity, none vs dflash:{k}", flush=True)
            cells += runs(
                [0.0],
                methods=[("none", 0), ("dflash", k)],
                engine_overrides={"enforce_eager": True},  # identity, not speed: fast start
                dtype=args.identity_dtype,
            )
    if "reference" in engines:
        from dflash.export import load_drafter  # imports torch: only for this engine
        from dflash.target import load_target

        print("reference loop (dflash/generate.py, float32)", flush=True)
        target = load_target(str(model_dir))
        drafter = load_drafter(drafter_dir)
        cells += reference_runs(
            target,
            drafter,
            prompts,
            args.max_tokens,
            args.batch_sizes,
            args.temperatures,
            tokenizer.eos_token_id,
        )
    records = [{**r, "path": "offline"} for r in finalize(cells)]
    docs = Path(args.docs)
    # the file also holds `agentserve bench sampling`'s records (they carry "test") and the
    # served rows of `agentserve bench speculative-served`
    write_json(
        records,
        docs / "benchmarks" / "speculative.json",
        keep=lambda r: "test" in r or r.get("path") == "served",
    )
    plot_speedups(records, docs / "img" / "speculative.png")
    table = markdown_table(records)
    command = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    body = (
        f"## Speculative decoding (DFlash vs n-gram vs none)\n\n"
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{len(prompts)} held-out prompts, {args.max_tokens} max tokens, "
        f"{time.perf_counter() - started:.0f} s). Raw figures: `benchmarks/speculative.json`.\n\n"
        f"{table}\nTokens emitted per step (tau histogram):\n\n{histogram_lines(records)}\n"
        f"![speedups](img/speculative.png)\n"
    )
    replace_section(docs / "benchmarks.md", "speculative", body)
    print(table)
    print(
        json.dumps(
            {
                "written": [
                    str(docs / "benchmarks.md"),
                    str(docs / "benchmarks" / "speculative.json"),
                ]
            }
        )
    )
    return 0

"""`agentserve bench fit-latency`: measure a running server's step costs and print the
`models[].latency_model` section the SLA policy plans with (spec/latency.py).

The platform carries a latency model for the bundled model on CPU only; for your own model
on your own hardware the SLA policy has none, so it scales reactively, from latencies it has
already missed. This command measures any OpenAI-compatible server (an `agentserve up`, a
replica behind a port-forward, `vllm serve`) as a user reaches it:
- decoding: `c` streams at once for each concurrency `c` (1, 2, 4, 8 by default; at most
  the replica's max_num_seqs, and one replica: scale it to 1 while measuring), each a unique
  prompt (no prefix-cache hits) generating exactly `--max-tokens` tokens (vLLM's
  ignore_eos); the median time per output token is one decode step of `c` sequences;
- prefill: one stream at a time, short and long unique prompts; the difference of their
  median TTFTs over the difference of their prompt tokens is the prefill cost per token.
`autoscale.model.fit` turns the steps into base_ms / knee_tokens / per_token_ms.

Measure the server with speculation off (`agentserve up --no-drafter`): a speculative step
emits several tokens, so its time per token is not a step's. The acceptance fields
(alpha_1, alpha_drop_per_doubling) come from `agentserve bench speculative-served` or the
replica's /metrics, not from here. The figures are written with `--out` (JSON) and printed
as YAML to paste under the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentserve.autoscale.model import Measurement, fit

from agentserve_bench.arg_types import ints
from agentserve_bench.served_client import Reply, stream_chat

__all__ = ["add_parser", "fit_latency", "latency_section", "measure", "read_served_fits", "run"]

_WORDS = [
    "table",
    "row",
    "column",
    "value",
    "index",
    "record",
    "field",
    "query",
    "cursor",
    "batch",
    "stream",
    "buffer",
    "cache",
    "token",
    "vector",
    "matrix",
    "tensor",
    "kernel",
    "shard",
    "lease",
    "queue",
    "worker",
    "socket",
    "packet",
    "header",
    "frame",
]


def _prompt(words: int, rng: random.Random) -> list[dict[str, Any]]:
    """A unique user message of about `words` words (a fresh tag first: no cached prefix)."""
    text = " ".join([uuid.uuid4().hex, *(rng.choice(_WORDS) for _ in range(words))])
    return [{"role": "user", "content": "Repeat these words: " + text}]


async def _wave(
    client: Any, model: str, prompts: Sequence[list[dict[str, Any]]], max_tokens: int
) -> list[Reply]:
    extra = {"ignore_eos": True}  # every stream generates max_tokens: a steady batch
    calls = (stream_chat(client, model, p, max_tokens, extra=extra) for p in prompts)
    return list(await asyncio.gather(*calls))


def _tpot_ms(replies: Sequence[Reply]) -> float:
    rates = [r.decode_tokens_per_s for r in replies if r.decode_tokens_per_s]
    if not rates:
        raise RuntimeError("no stream produced two tokens or more: is --max-tokens below 2?")
    return statistics.median(1000.0 / rate for rate in rates)


async def measure(
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    concurrencies: Sequence[int] = (1, 2, 4, 8),
    max_tokens: int = 64,
    rounds: int = 2,
    prompt_words: tuple[int, int] = (16, 400),
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The raw figures: per concurrency the median time per output token (ms), and the
    short and long prompts' median TTFT (ms) with their prompt tokens."""
    import httpx

    rng = random.Random(0)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(concurrencies) + 2)
    async with httpx.AsyncClient(
        base_url=base_url.rstrip("/"), headers=headers, limits=limits, timeout=600, trust_env=False
    ) as client:
        await _wave(client, model, [_prompt(8, rng)], 4)  # warm-up: a first request compiles
        decode = []
        for c in concurrencies:
            replies: list[Reply] = []
            for _ in range(rounds):
                prompts = [_prompt(prompt_words[0], rng) for _ in range(c)]
                replies += await _wave(client, model, prompts, max_tokens)
            tpot = _tpot_ms(replies)
            decode.append({"concurrency": c, "tpot_ms": round(tpot, 3)})
            progress(f"decode at concurrency {c}: {tpot:.1f} ms per output token")
        prefill = []
        for words in prompt_words:
            replies = []
            for _ in range(2 * rounds + 1):
                replies += await _wave(client, model, [_prompt(words, rng)], 2)
            ttft = statistics.median(r.ttft_ms for r in replies if r.ttft_ms is not None)
            tokens = statistics.median(r.prompt_tokens for r in replies)
            prefill.append({"prompt_tokens": tokens, "ttft_ms": round(ttft, 3)})
            progress(f"prefill of {tokens:.0f} prompt tokens: TTFT {ttft:.1f} ms")
    return {"decode": decode, "prefill": prefill}


def fit_latency(figures: dict[str, Any]) -> dict[str, float]:
    """The latency_model section (spec/latency.py) fitted to `measure`'s figures."""
    records = [Measurement(d["concurrency"], 0, d["tpot_ms"], 1.0) for d in figures["decode"]]
    short, long = figures["prefill"][0], figures["prefill"][-1]
    extra_tokens = long["prompt_tokens"] - short["prompt_tokens"]
    per_token = (long["ttft_ms"] - short["ttft_ms"]) / extra_tokens if extra_tokens > 0 else 0.0
    model = fit(records, prefill_ms_per_token=round(max(0.0, per_token), 4))
    return {
        "base_ms": model.base_ms,
        "knee_tokens": model.knee_tokens,
        "per_token_ms": model.per_token_ms,
        "prefill_ms_per_token": model.prefill_ms_per_token,
    }


def latency_section(model: str, section: dict[str, float]) -> str:
    """The section as spec YAML, under its model."""
    lines = ["models:", f"  - name: {model}", "    latency_model:"]
    lines += [f"      {key}: {value:g}" for key, value in section.items()]
    return "\n".join(lines)


def read_served_fits(bench_dir: Path) -> dict[str, dict[str, tuple]]:
    """{cpu_class: {dtype: terms}} as the committed figures files in `bench_dir` give it:
    each fit_latency_<cpu_class>.json's `latency_model`, under the dtype `agentserve up`
    serves the bundled model in on that kind of CPU."""
    from agentserve.autoscale.served_fit import FILE_PREFIX, TERMS
    from agentserve.drafters import default_dtype
    from agentserve.spec import BUNDLED_MODEL

    out: dict[str, dict[str, tuple]] = {}
    for path in sorted(bench_dir.glob(f"{FILE_PREFIX}*.json")):
        kind = path.stem.removeprefix(FILE_PREFIX)
        section = json.loads(path.read_text(encoding="utf-8"))["latency_model"]
        dtype = default_dtype(BUNDLED_MODEL, kind) or "bfloat16"
        out[kind] = {dtype: tuple(float(section[t]) for t in TERMS)}
    return out


def _write_profile(out: Path, section: dict[str, float]) -> None:
    """A figures file named docs/benchmarks/fit_latency_<cpu_class>.json in a checkout (the
    kind of CPU the served replica ran on) also sets that kind's `served_fit` in its
    profile, under the dtype `agentserve up` serves the bundled model in there."""
    from agentserve.autoscale.served_fit import FILE_PREFIX
    from agentserve.drafters import default_dtype
    from agentserve.spec import BUNDLED_MODEL

    from agentserve_bench.profile_write import profile_dir, write_profile_section

    directory = profile_dir(out.resolve().parent.parent)
    if not out.stem.startswith(FILE_PREFIX) or directory is None:
        return
    machine = out.stem.removeprefix(FILE_PREFIX)
    dtype = default_dtype(BUNDLED_MODEL, machine) or "bfloat16"
    command = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows = f"docs/benchmarks/{out.name}"
    write_profile_section(machine, "served_fit", {dtype: section}, command, rows, directory)


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "fit-latency",
        help="measure a running server's step costs; print models[].latency_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://HOST:8000")
    p.add_argument("--model", required=True, help="the served model name (as in /v1/models)")
    p.add_argument("--api-key", help="a tenant's API key, when the server requires one")
    p.add_argument(
        "--concurrency",
        type=ints,
        default=[1, 2, 4, 8],
        help="streams at once per decode level, comma-separated (default 1,2,4,8; at most "
        "the replica's max_num_seqs)",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per stream (default 64)")
    p.add_argument("--rounds", type=int, default=2, help="waves per level (default 2)")
    p.add_argument("--out", type=Path, help="also write the figures and the fit here (JSON)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.max_tokens < 2 or args.rounds < 1 or not args.concurrency:
        print("error: --max-tokens must be at least 2, --rounds at least 1", file=sys.stderr)
        return 2
    if min(args.concurrency) < 1 or len(set(args.concurrency)) < 2:
        print("error: --concurrency needs two or more distinct levels, each >= 1", file=sys.stderr)
        return 2
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    url = args.url.rstrip("/").removesuffix("/v1")  # the OpenAI base URL works too
    try:
        figures = asyncio.run(
            measure(
                url,
                args.model,
                api_key=args.api_key,
                concurrencies=args.concurrency,
                max_tokens=args.max_tokens,
                rounds=args.rounds,
                progress=say,
            )
        )
    except (OSError, RuntimeError) as err:  # unreachable server, refused request
        print(f"error: measuring {args.url} failed: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # httpx's own errors (timeouts, protocol)
        print(f"error: measuring {args.url} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    section = fit_latency(figures)
    if section["base_ms"] <= 0:
        print(
            f"error: the fit gave a step time of {section['base_ms']:g} ms: the figures "
            f"({figures['decode']}) do not grow with concurrency as a batch does; measure one "
            "replica, with levels at most its max_num_seqs",
            file=sys.stderr,
        )
        return 1
    if args.out is not None:
        args.out.write_text(json.dumps({"figures": figures, "latency_model": section}, indent=2))
        _write_profile(args.out, section)
    print(latency_section(args.model, section))
    return 0

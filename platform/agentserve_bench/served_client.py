"""The client side of `agentserve bench speculative-served`: held-out workloads, one streamed
chat request as a user sends it, a workload at a concurrency, and the server's speculation
counters read from its Prometheus endpoint.

Workloads come from packages no drafter training prompt uses (dflash.train.code_prompts'
HELDOUT_PACKAGES), never from HumanEval or the standard library:
"coding" (complete, fix, explain or edit a real function) and "agent" (tool output to
summarise, multi-turn exchanges with tool calls and tool results the reply must quote,
tool-call generation from real tool schemas).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

from agentserve_bench.heldout_workloads import KINDS, kind_messages, text_half

__all__ = [
    "WORKLOADS",
    "Reply",
    "level_figures",
    "parse_spec_counters",
    "read_spec_counters",
    "run_workload",
    "stream_chat",
    "workload_messages",
]

WORKLOADS = ("coding", "agent", *KINDS)
_SOURCES = {"coding": "heldout-code-", "agent": "heldout-agent-"}


def workload_messages(
    workload: str, n: int, seed: int = 10_000, half: str | None = None
) -> list[list[dict[str, Any]]]:
    """`n` chat conversations of one workload (held-out packages only), from one half
    (heldout_workloads.half_of: "tune" or "report"; None: both)."""
    from dflash.train.code_prompts import heldout_context_prompts  # reads package sources

    if workload in KINDS:
        return kind_messages(workload, n, half, seed=seed)
    if workload not in _SOURCES:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    prefix = _SOURCES[workload]
    chats = [
        p.chat() for p in heldout_context_prompts(8 * n, seed=seed) if p.source.startswith(prefix)
    ]
    picked = [chat for chat in chats if half is None or text_half(chat) == half]
    if len(picked) < n:
        raise ValueError(f"only {len(picked)} held-out {workload} prompts, {n} asked")
    return picked[:n]


@dataclass(frozen=True)
class Reply:
    """One request as the caller saw it (perf_counter seconds; first/last: chunks with text)."""

    start_s: float
    first_s: float | None
    last_s: float | None
    output_tokens: int
    text: str
    prompt_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens (prefix cache hits)

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_s is None else 1000 * (self.first_s - self.start_s)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Output tokens after the first over the time between first and last chunk."""
        if self.first_s is None or self.last_s is None or self.output_tokens < 2:
            return None
        span = self.last_s - self.first_s
        return (self.output_tokens - 1) / span if span > 0 else None


async def stream_chat(
    client: Any,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    temperature: float = 0.0,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> Reply:
    """A streamed POST /v1/chat/completions (usage in the last chunk), as the openai SDK
    sends it, with `extra` body fields; raises RuntimeError on a non-200 answer."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    start = time.perf_counter()
    first = last = None
    usage: dict[str, Any] = {}
    parts: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or [{}]
            text = (choices[0].get("delta") or {}).get("content")
            if text:
                last = time.perf_counter()
                first = first or last
                parts.append(text)
            usage = chunk.get("usage") or usage
    return Reply(
        start,
        first,
        last,
        usage.get("completion_tokens", 0),
        "".join(parts),
        usage.get("prompt_tokens", 0),
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
    )


async def run_workload(
    base_url: str,
    model: str,
    conversations: list[list[dict[str, Any]]],
    concurrency: int,
    max_tokens: int,
    timeout_s: float = 600.0,
    temperature: float = 0.0,
) -> tuple[list[Reply], float]:
    """Every conversation once, `concurrency` at a time, sampled at `temperature`;
    (replies in conversation order, wall seconds)."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 2)
    replies: list[Reply | None] = [None] * len(conversations)
    counter = itertools.count()
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=httpx.Timeout(timeout_s), trust_env=False
    ) as client:

        async def worker() -> None:
            while (i := next(counter)) < len(conversations):
                replies[i] = await stream_chat(
                    client, model, conversations[i], max_tokens, temperature
                )

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return [r for r in replies if r is not None], wall


def level_figures(replies: list[Reply], wall_s: float) -> dict[str, Any]:
    """Decode tokens/s (mean over requests), TTFT p50, throughput, of one workload level."""
    rates = [r.decode_tokens_per_s for r in replies if r.decode_tokens_per_s]
    ttfts = [r.ttft_ms for r in replies if r.ttft_ms is not None]
    tokens = sum(r.output_tokens for r in replies)
    return {
        "requests": len(replies),
        "output_tokens": tokens,
        "decode_tokens_per_s": round(statistics.fmean(rates), 2) if rates else None,
        "ttft_ms_p50": round(statistics.median(ttfts), 1) if ttfts else None,
        "throughput_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "wall_s": round(wall_s, 1),
    }


_COUNTERS = {
    # vLLM's own server
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
    # agentserve's admin /metrics (serve/metrics.py)
    "agentserve_spec_decode_drafts_total": "drafts",
    "agentserve_spec_decode_draft_tokens_total": "draft_tokens",
    "agentserve_spec_decode_accepted_tokens_total": "accepted_tokens",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+)")


_PROPOSER = re.compile(r'proposer="([^"]*)"')


def parse_spec_counters(text: str) -> dict[str, float]:
    """Speculation counters (drafts, draft_tokens, accepted_tokens), summed over labels, from a
    Prometheus text page of vLLM's server or agentserve's admin endpoint (pure); with hybrid
    drafting also "PROPOSER.drafts", "PROPOSER.draft_tokens", "PROPOSER.accepted_tokens"
    per proposer (agentserve_spec_decode_proposer_*), and "steps_block" /
    "steps_context_only" (agentserve_spec_decode_hybrid_steps)."""
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        name = match.group(1)
        if name in _COUNTERS:
            out[_COUNTERS[name]] += float(match.group(3))
        elif name == _HYBRID_STEPS:
            kind = _KIND.search(match.group(2) or "")
            if kind:
                key = f"steps_{kind.group(1)}"
                out[key] = out.get(key, 0.0) + float(match.group(3))
        elif name.startswith(_BY_PROPOSER) and name.endswith("_total"):
            proposer = _PROPOSER.search(match.group(2) or "")
            field = name.removeprefix(_BY_PROPOSER).removesuffix("_total")
            if proposer:
                key = f"{proposer.group(1)}.{field}"
                out[key] = out.get(key, 0.0) + float(match.group(3))
    return out


_BY_PROPOSER = "agentserve_spec_decode_proposer_"
_HYBRID_STEPS = "agentserve_spec_decode_hybrid_steps_total"
_KIND = re.compile(r'kind="([a-z_]+)"')


def read_spec_counters(metrics_url: str) -> dict[str, float]:
    import httpx

    return parse_spec_counters(httpx.get(metrics_url, timeout=10, trust_env=False).text)

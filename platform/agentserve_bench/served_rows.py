"""Served speculation figures as records, and the rule that picks `agentserve up`'s default
method from them (pure: table-tested, and the default's test reads the committed records).

A record is one (server, method, k, workload, concurrency) cell measured through the HTTP
API in one run of `agentserve bench speculative-served`; see `row` for the fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MIN_C1_SPEEDUP",
    "MIN_LOADED_SPEEDUP",
    "fill_ratios",
    "method_scores",
    "row",
    "served_default",
]

# A method becomes the default only when it pays clearly where a user meets it: at least
# this much faster than plain at concurrency 1 on every workload (run-to-run noise on a
# shared 2-core machine is a few percent) ...
MIN_C1_SPEEDUP = 1.05
# ... and not slower at higher concurrency (within noise) on every workload.
MIN_LOADED_SPEEDUP = 0.97


def row(
    *,
    server: str,
    method: str,
    k: int,
    workload: str,
    concurrency: int,
    figures: dict[str, Any],
    counters: dict[str, float],
    machine: dict[str, Any],
    dtype: str,
    engine_env: dict[str, str],
    texts: list[str],
    settings: str = "default",
) -> dict[str, Any]:
    """One served record (speedup and identity are filled by `fill_ratios`)."""
    drafts = counters.get("drafts", 0.0)
    accepted = counters.get("accepted_tokens", 0.0)
    drafted = counters.get("draft_tokens", 0.0)
    return {
        "path": "served",
        "server": server,
        "engine": "vllm",
        "method": method,
        "num_speculative_tokens": k,
        "workload": workload,
        "concurrency": concurrency,
        "temperature": 0.0,
        "dtype": dtype,
        **figures,
        # tokens per verify step that carried a draft (1 + accepted / drafts)
        "tau": round(1 + accepted / drafts, 3) if drafts else (1.0 if method == "none" else None),
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "drafts": int(drafts),
        "machine": machine,
        "settings": settings,
        "engine_env": engine_env,
        "texts": texts,
    }


def fill_ratios(records: list[dict[str, Any]], default_method: str | None) -> list[dict[str, Any]]:
    """Each record with `speedup_vs_plain` (decode tokens/s over the "none" record of the
    same server and engine settings at the same workload and concurrency, same run),
    `throughput_vs_plain`, `greedy_identical` ("i/n" replies equal to plain's) and `default`
    (the method `agentserve up` uses, on the agentserve rows with the default settings)."""
    plain = {_cell(r): r for r in records if r["method"] == "none"}
    out = []
    for r in records:
        base = plain.get(_cell(r))
        extra: dict[str, Any] = {"speedup_vs_plain": None, "throughput_vs_plain": None}
        if base is not None:
            extra["speedup_vs_plain"] = _ratio(
                r["decode_tokens_per_s"], base["decode_tokens_per_s"]
            )
            extra["throughput_vs_plain"] = _ratio(
                r["throughput_tokens_per_s"], base["throughput_tokens_per_s"]
            )
            same = sum(a == b for a, b in zip(r["texts"], base["texts"], strict=False))
            extra["greedy_identical"] = f"{same}/{len(base['texts'])}"
        want = default_method or "none"
        extra["default"] = _deciding(r) and r["method"] == want
        out.append({**r, **extra})
    return out


def _cell(r: dict[str, Any]) -> tuple:
    return (r["server"], r.get("settings", "default"), r["workload"], r["concurrency"])


def _deciding(r: dict[str, Any]) -> bool:
    """A record the default is decided from: agentserve, served, the default settings."""
    served = r.get("path") == "served" and r.get("server") == "agentserve"
    return served and r.get("settings", "default") == "default"


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def method_scores(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method (its best k), from agentserve's served records: the geometric-mean speedup
    over workloads and concurrencies, and whether it passes the default's bar."""
    cells: dict[tuple[str, int], dict[tuple[str, int], float]] = {}
    for r in records:
        if not _deciding(r) or r["method"] == "none":
            continue
        if r.get("speedup_vs_plain") is None:
            continue
        key = (r["method"], r["num_speculative_tokens"])
        cells.setdefault(key, {})[(r["workload"], r["concurrency"])] = r["speedup_vs_plain"]
    scores: dict[str, dict[str, Any]] = {}
    for (method, k), by_cell in cells.items():
        geo = math.exp(sum(math.log(s) for s in by_cell.values()) / len(by_cell))
        passes = all(
            s >= (MIN_C1_SPEEDUP if c == 1 else MIN_LOADED_SPEEDUP) for (_, c), s in by_cell.items()
        )
        if method not in scores or geo > scores[method]["score"]:
            scores[method] = {
                "k": k,
                "score": round(geo, 3),
                "passes": passes,
                "cells": len(by_cell),
            }
    return scores


def served_default(records: Iterable[dict[str, Any]]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The method `agentserve up` should use ("none": plain decoding) and every method's
    score: the best geometric mean among methods that pass the bar, else "none"."""
    scores = method_scores(records)
    passing = {m: s for m, s in scores.items() if s["passes"]}
    if not passing:
        return "none", scores
    return max(passing, key=lambda m: passing[m]["score"]), scores

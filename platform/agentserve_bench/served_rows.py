"""Served speculation figures as records, and the rule that picks `agentserve up`'s default
method from them (pure: table-tested, and the default's test reads the committed records).

A record is one (server, method, k, workload, concurrency) cell measured through the HTTP
API in one run of `agentserve bench speculative-served`; see `row` for the fields.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentserve.drafters import shipped_drafter
from agentserve.sources.models import BUNDLED_MODEL

from agentserve_bench.settings_bundles import DEFAULT_SETTINGS, default_settings

__all__ = [
    "LEGACY_DRAFTER_DIGEST",
    "MIN_C1_SPEEDUP",
    "MIN_LOADED_SPEEDUP",
    "by_machine",
    "by_proposer",
    "deciding",
    "drafter_digest",
    "fill_ratios",
    "hybrid_steps",
    "method_scores",
    "row",
    "rows_of_shipped_drafter",
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
    settings: str = DEFAULT_SETTINGS,
    drafter: str | None = None,
    schedule: list[list[int]] | None = None,
    half: str | None = None,
    speculative_config: dict[str, Any] | None = None,
    temperature: float = 0.0,
    cpu_s_by_role: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One served record (speedup and identity are filled by `fill_ratios`); `drafter`: the
    DFlash drafter's digest (drafter_digest) on dflash and hybrid rows;
    `schedule`: the per-batch drafted tokens the server ran with ([[start, end, k]], as
    `num_speculative_tokens_per_batch_size`; None: k at every batch); `half`: the workload
    half measured (heldout_workloads.half_of: "tune" rows may decide defaults, "report" rows
    never do); `speculative_config`: the engine's speculative_config as the server got it
    (so a peer row says what it ran); `temperature`: the requests' sampling temperature
    (rows at T > 0 are compared with plain decoding at the same temperature and never
    decide the default); `cpu_s_by_role`: CPU seconds by process role over the level
    (process_cpu.py; left out when not measured)."""
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
        "temperature": temperature,
        "dtype": dtype,
        **figures,
        # tokens per verify step that carried a draft (1 + accepted / drafts)
        "tau": round(1 + accepted / drafts, 3) if drafts else (1.0 if method == "none" else None),
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "drafts": int(drafts),
        **by_proposer(counters),
        **hybrid_steps(counters),
        "machine": machine,
        "settings": settings,
        "engine_env": engine_env,
        **({"drafter": drafter} if drafter else {}),
        **({"schedule": schedule} if schedule and method != "none" else {}),
        **({"half": half} if half else {}),
        **({"speculative_config": speculative_config} if speculative_config else {}),
        **({"cpu_s_by_role": cpu_s_by_role} if cpu_s_by_role else {}),
        "texts": texts,
    }


def hybrid_steps(counters: dict[str, float]) -> dict[str, Any]:
    """Hybrid drafting's steps ("steps_block", "steps_context_only" in `counters`):
    {"context_only_steps": share of drafting steps without DFlash's block forward}; {}
    for other methods."""
    block = counters.get("steps_block", 0.0)
    context_only = counters.get("steps_context_only", 0.0)
    if not block + context_only:
        return {}
    return {"context_only_steps": round(context_only / (block + context_only), 3)}


def by_proposer(counters: dict[str, float]) -> dict[str, Any]:
    """Hybrid drafting's split ("PROPOSER.drafts" etc. in `counters`): {"proposers":
    {name: {"drafts", "share" of all drafts, "tau" of its drafts}}}; {} for other methods."""
    names = sorted({key.split(".", 1)[0] for key in counters if "." in key})
    total = sum(counters.get(f"{n}.drafts", 0.0) for n in names)
    if not names or not total:
        return {}
    out = {}
    for n in names:
        drafts = counters.get(f"{n}.drafts", 0.0)
        accepted = counters.get(f"{n}.accepted_tokens", 0.0)
        out[n] = {
            "drafts": int(drafts),
            "share": round(drafts / total, 3),
            "tau": round(1 + accepted / drafts, 3) if drafts else None,
        }
    return {"proposers": out}


def fill_ratios(
    records: list[dict[str, Any]], default_method: str | None, default_k: int | None = None
) -> list[dict[str, Any]]:
    """Each record with `speedup_vs_plain` (decode tokens/s over the "none" record of the
    same server and engine settings at the same workload and concurrency, same run),
    `throughput_vs_plain`, `greedy_identical` ("i/n" replies equal to plain's) and `default`
    (the method `agentserve up` uses, at `default_k` drafted tokens when given: a method
    measured at several k drafts at its best one, on the agentserve rows with the default
    settings)."""
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
            if not r.get("temperature"):  # sampled replies differ by design
                ours, plain_replies = _replies(r), _replies(base)
                same = sum(a == b for a, b in zip(ours, plain_replies, strict=False))
                extra["greedy_identical"] = f"{same}/{len(plain_replies)}"
        want = default_method or "none"
        at_k = default_k is None or r.get("num_speculative_tokens") == default_k
        extra["default"] = deciding(r) and r["method"] == want and at_k
        out.append({**r, **extra})
    return out


def _replies(r: dict[str, Any]) -> list[str]:
    """The reply texts of a record, or their digests once written (served_report)."""
    return r["texts"] if "texts" in r else r.get("text_digests", [])


def _cell(r: dict[str, Any]) -> tuple:
    machine = r.get("machine", {}).get("cpu_class")  # a ratio never crosses machines
    return (
        machine,
        r["server"],
        r.get("settings", DEFAULT_SETTINGS),
        r["workload"],
        r["concurrency"],
        r.get("half"),
        r.get("temperature", 0.0),
    )


def machine_default_settings(r: dict[str, Any]) -> str:
    """The settings `agentserve up` applies on the kind of CPU a record was measured on."""
    return default_settings(r.get("machine", {}).get("cpu_class", "other"))


def deciding(r: dict[str, Any]) -> bool:
    """A record the default is decided from: agentserve, served, the default settings of
    its kind of CPU (rows without a label predate the labels: DEFAULT_SETTINGS), never a
    row of the reporting half (rows without a half predate the split and still decide until
    the tuning half is measured on their kind of CPU), never a row sampled at T > 0."""
    served = r.get("path") == "served" and r.get("server") == "agentserve"
    if r.get("half") == "report" or r.get("temperature"):
        return False
    return served and r.get("settings", DEFAULT_SETTINGS) == machine_default_settings(r)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def method_scores(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method (its best k), from agentserve's served records: the geometric-mean speedup
    over workloads and concurrencies, and whether it passes the default's bar."""
    cells: dict[tuple[str, int], dict[tuple[str, int], float]] = {}
    for r in records:
        if not deciding(r) or r["method"] == "none":
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


def by_machine(records: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by the kind of CPU they were measured on (engine/cpu_info cpu_class):
    each kind gets its own default, from its own rows."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r.get("machine", {}).get("cpu_class", "other"), []).append(r)
    return out


def served_default(records: Iterable[dict[str, Any]]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The method `agentserve up` should use ("none": plain decoding) and every method's
    score: the best geometric mean among methods that pass the bar, else "none"."""
    scores = method_scores(records)
    passing = {m: s for m, s in scores.items() if s["passes"]}
    if not passing:
        return "none", scores
    return max(passing, key=lambda m: passing[m]["score"]), scores


def reply_seconds(r: dict[str, Any]) -> float | None:
    """A typical reply's time at the caller (pure): TTFT p50 plus the mean reply's remaining
    tokens at the decode rate; what a user waits for, prefill and decode together."""
    tokens = r["output_tokens"] / max(1, r["requests"])
    if not r.get("decode_tokens_per_s") or r.get("ttft_ms_p50") is None:
        return None
    return r["ttft_ms_p50"] / 1000 + max(0.0, tokens - 1) / r["decode_tokens_per_s"]


def settings_scores(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per engine-settings bundle of agentserve's served rows measured in one run (same
    command): the method the default rule picks under it, and the mean reply time at
    concurrency 1 over workloads with that method (lower is better)."""
    by_settings: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("path") == "served" and r.get("server") == "agentserve":
            by_settings.setdefault(r.get("settings", DEFAULT_SETTINGS), []).append(r)
    out = {}
    for name, rows in by_settings.items():
        relabelled = [{**r, "settings": machine_default_settings(r)} for r in rows]
        method, _ = served_default(fill_ratios(relabelled, None))
        times = [reply_seconds(r) for r in rows if r["method"] == method and r["concurrency"] == 1]
        times = [t for t in times if t is not None]
        out[name] = {
            "method": method,
            "reply_s": round(sum(times) / len(times), 2) if times else None,
            "command": rows[0].get("command"),
        }
    return out


def drafter_digest(directory: Path) -> str:
    """Which drafter this is: the first 12 hex digits of a sha256 over its weight files (in
    name order). Figures measured with a drafter carry it, so the fits that read them take
    only the rows of the drafter shipped now, not those of one it replaced."""
    digest = hashlib.sha256()
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors) in {directory}")
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


LEGACY_DRAFTER_DIGEST = "1d6d62245b23"
"""The drafter every served dflash/hybrid row without a digest was measured with: digests
were first recorded after it (its rows date from 2026-11-25 to 2026-11-27)."""


def rows_of_shipped_drafter(records: list[dict], digest: str | None = None) -> list[dict]:
    """`records` without the dflash and hybrid rows measured with another drafter than
    `digest` (default: the bundled model's shipped drafter): what the fits and the default
    read, so a new drafter's figures replace, never mix with, its predecessor's."""
    if digest is None:
        shipped = shipped_drafter(BUNDLED_MODEL)
        digest = drafter_digest(shipped) if shipped is not None else ""
    return [
        r
        for r in records
        if r.get("method") not in ("dflash", "hybrid")
        or r.get("drafter", LEGACY_DRAFTER_DIGEST) == digest
    ]

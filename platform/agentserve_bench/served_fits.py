"""The fits the benchmarks write into the machine profiles, from committed served rows
(pure): each speculative method's acceptance and draft rate (the pooled profile's
`acceptance`, `draft_rate`), the served factors of its speedups and of a plain step
(`served_factor`). The runtime reads the profiles (agentserve/profiles); these only fit
them (agentserve_bench/profile_write.py, calibrate.py), and tests hold the shipped profiles
equal to what they give from the rows.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from agentserve.autoscale.model import alpha_from_tau, drafted_for
from agentserve.speculation.choice import ks_timed, predicted_speedup

from agentserve_bench.settings_bundles import default_settings, fitted_settings, schedule_off

__all__ = [
    "acceptance_from_served",
    "draft_rate_from_served",
    "factor_rows",
    "served_factors",
    "served_step_factor",
]


def draft_rate_from_served(records: list[dict]) -> dict[str, float]:
    """{method: mean over agentserve's served rows at concurrency 1 of drafts / (drafts +
    steps that drafted nothing)} (pure). A row's drafting steps emitted drafts x tau of its
    tokens after each request's first; every other token took a plain step of its own."""
    by: dict[str, list[float]] = {}
    for r in records:
        if r.get("path") != "served" or r.get("server") != "agentserve":
            continue
        if r.get("method") in (None, "none") or r.get("concurrency") != 1:
            continue
        if not (r.get("drafts") and r.get("tau") and r.get("output_tokens") and r.get("requests")):
            continue
        plain = max(0.0, r["output_tokens"] - r["requests"] - r["drafts"] * r["tau"])
        by.setdefault(r["method"], []).append(r["drafts"] / (r["drafts"] + plain))
    return {method: round(sum(v) / len(v), 3) for method, v in sorted(by.items())}


def acceptance_from_served(records: list[dict]) -> dict[str, tuple[float, float]]:
    """(alpha_1, alpha_drop_per_doubling) per method from served records (pure): alpha is
    the per-token acceptance whose geometric tau at the k the row drafted matches the
    measured tau, pooled over workloads by mean; the drop is fitted between concurrency 1
    and the highest concurrency measured (0 when that is 1 or acceptance does not fall).

    Which rows say what k they drafted (`_drafted_k`): a row measured with the schedule
    off (settings_bundles.SCHEDULE_OFF) drafted its k at every batch; a row under a schedule it
    recorded drafted, at concurrency 1, the schedule's k for batch 1, and at a higher
    concurrency a mix of batch sizes (no single k); a row from before rows recorded their
    schedule says nothing sure. Where a method has rows that say, only those count: a
    schedule may have drafted fewer than the row's k, or none (a c=4 n-gram row reporting
    k=8 with the tau of steps that drafted 2 made prompt lookup's acceptance seem to fall
    with the batch; at a fixed k its tau is the same at c=4 as at c=1). The drop is fitted
    from rows that drafted one k at every concurrency where the method has any."""
    rows = [
        r
        for r in records
        if r.get("path") == "served" and r.get("server") == "agentserve" and r.get("tau")
        and r["method"] != "none" and r["tau"] > 1.0
    ]  # fmt: skip
    sure = {r["method"] for r in rows if _drafted_k(r) is not None}
    by: dict[str, dict[int, list[float]]] = {}  # alphas per concurrency, rows that count
    fixed: dict[str, dict[int, list[float]]] = {}  # the same k at every concurrency
    for r in rows:
        k = _drafted_k(r)
        if k is None and r["method"] in sure:
            continue
        alpha = alpha_from_tau(r["tau"], k if k is not None else r["num_speculative_tokens"])
        by.setdefault(r["method"], {}).setdefault(r["concurrency"], []).append(alpha)
        if schedule_off(r.get("settings")):
            fixed.setdefault(r["method"], {}).setdefault(r["concurrency"], []).append(alpha)
    out = {}
    for method, per_c in by.items():
        if 1 not in per_c:
            continue
        a1 = _mean(per_c[1])
        # the drop from rows that drafted one k at every concurrency (the schedule-off
        # ones), where a method has them: a c=1 row under a schedule has no c=4 twin
        span = fixed.get(method, {}) if method in sure else per_c
        top = max(span, default=1)
        drop = 0.0
        if top > 1 and 1 in span:
            drop = max(0.0, (_mean(span[1]) - _mean(span[top])) / math.log2(top))
        out[method] = (round(a1, 3), round(drop, 3))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _drafted_k(row: dict) -> int | None:
    """The k a served row drafted at each of its steps, where the row says (see
    acceptance_from_served); None where it does not, or where it drafted nothing."""
    if schedule_off(row.get("settings")):
        return row["num_speculative_tokens"]
    schedule = row.get("schedule")
    if not schedule or row["concurrency"] != 1:
        return None
    return drafted_for([tuple(r) for r in schedule], 1) or None


def served_factors(
    profiles: list[Mapping[str, Any]],
    records: list[Mapping[str, Any]],
    draft_fraction: Mapping[str, float] | None = None,
    concurrency: int = 1,
) -> dict[str, float]:
    """{method: min over the `factor_rows` at `concurrency` (served agentserve rows under the
    engine settings `agentserve up` applies on the row's kind of CPU, the speculation
    schedule on or off: settings_bundles.fitted_settings) of measured speedup / speedup
    predicted from the profile of the same kind of machine at that batch, with the row's
    own tau and the method's `draft_fraction` (as `choose` predicts it: the drafting is in
    the prediction, so the factor holds only what the rest of vLLM's step adds)}, capped at
    1 (only ever a correction downwards). Methods with no pair are absent. Where a method
    has schedule-off rows on a kind of CPU, only those count there, as in
    acceptance_from_served: under the schedule a row's k and tau describe
    only the batches that drafted."""
    draft_fraction = draft_fraction or {}
    by_class = {p["machine"]["cpu_class"]: p for p in profiles}
    out: dict[str, float] = {}
    for r in factor_rows(records, set(by_class), concurrency):
        machine = r["machine"]["cpu_class"]
        profile, k = by_class[machine], int(r["num_speculative_tokens"])
        if (
            r.get("dtype") not in profile["dtypes"]
            or str(concurrency) not in profile["dtypes"][r["dtype"]]["step_ms"]
        ):
            continue
        if k not in ks_timed(profile, r["dtype"], concurrency):
            continue  # the profile did not time this verification's size
        frac = draft_fraction.get(r["method"], 0.0)
        tau = float(r["tau"])
        predicted = predicted_speedup(profile, r["dtype"], concurrency, k, tau, frac)
        factor = min(1.0, float(r["speedup_vs_plain"]) / predicted)
        out[r["method"]] = round(min(out.get(r["method"], 1.0), factor), 3)
    return out


def factor_rows(
    records: list[Mapping[str, Any]], cpu_classes: Collection[str], concurrency: int = 1
) -> list[Mapping[str, Any]]:
    """The served rows `served_factors` fits at `concurrency` on `cpu_classes`: agentserve's,
    with a speculative method and a tau, under the settings `agentserve up` applies there;
    only the schedule-off rows of a method on a kind of CPU where it has some."""
    usable = [
        r for r in records
        if r.get("path") == "served" and r.get("server") == "agentserve"
        and (r.get("machine") or {}).get("cpu_class") in cpu_classes
        and r.get("method") not in (None, "none") and r.get("concurrency") == concurrency
        and r.get("tau") and fitted_settings(r.get("settings"), r["machine"]["cpu_class"])
    ]  # fmt: skip
    off = {
        (r["machine"]["cpu_class"], r["method"]) for r in usable if schedule_off(r.get("settings"))
    }
    return [
        r for r in usable
        if schedule_off(r.get("settings")) or (r["machine"]["cpu_class"], r["method"]) not in off
    ]  # fmt: skip


def served_step_factor(
    profiles: list[Mapping[str, Any]], records: list[Mapping[str, Any]]
) -> float:
    """max over served agentserve plain rows at concurrency 1 (with a profile of the same kind
    of machine and dtype, under the engine settings `agentserve up` applies there: what the
    capacity model plans for) of the row's step (1000 / decode tok/s) / the profile's decode
    step at batch 1; at least 1 (the GEMMs are part of the step), 1 without any pair."""
    by_class = {p["machine"]["cpu_class"]: p for p in profiles}
    factor = 1.0
    for r in records:
        cpu_class = (r.get("machine") or {}).get("cpu_class")
        profile = by_class.get(cpu_class)
        if r.get("path") != "served" or r.get("server") != "agentserve" or profile is None:
            continue
        if r.get("settings", default_settings(cpu_class)) != default_settings(cpu_class):
            continue
        if r.get("method") != "none" or r.get("concurrency") != 1:
            continue
        if not r.get("decode_tokens_per_s") or r.get("dtype") not in profile["dtypes"]:
            continue
        decode = float(profile["dtypes"][r["dtype"]]["step_ms"]["1"]["1"])
        factor = max(factor, 1000.0 / float(r["decode_tokens_per_s"]) / decode)
    return round(factor, 3)

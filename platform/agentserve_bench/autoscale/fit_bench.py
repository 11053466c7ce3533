"""Fit the LatencyModel from `agentserve bench speculative` results (real vLLM runs).

    agentserve bench speculative --engines vllm --batch-sizes 1,2,4,8 --temperatures 0
    python -m agentserve_bench.autoscale.fit_bench docs/benchmarks/speculative.json \
        --out docs/benchmarks/latency_model.json
    agentserve bench autoscale --latency-model docs/benchmarks/latency_model.json

Each vLLM cell (method none or dflash, batch b, drafted k, tokens/s, tau) becomes a
`Measurement`: every verify step emits b x tau tokens, so step_ms = 1000 x b x tau /
tokens_per_s (an upper bound: the cell's time also holds prefills and a shrinking batch
at its end). DFlash cells carry tau, so acceptance vs batch size is fitted too; n-gram
and reference-loop cells are skipped. Prefill cost is not in these runs: pass
--prefill-ms-per-token to set it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentserve.autoscale.model import LatencyModel, Measurement, fit

from agentserve_bench.report import default_docs

__all__ = ["fit_bench_records", "main", "measurements_from_bench"]


def measurements_from_bench(
    records: Iterable[Mapping[str, Any]], temperature: float = 0.0
) -> list[Measurement]:
    """Measurements from speculative-benchmark records: vLLM engine, methods none and
    dflash, at `temperature` only (acceptance depends on it)."""
    out = []
    for r in records:
        if r.get("engine") != "vllm" or r.get("method") not in ("none", "dflash"):
            continue
        if float(r["temperature"]) != temperature or not r.get("tokens_per_s"):
            continue
        batch, drafted = int(r["batch_size"]), int(r["num_speculative_tokens"])
        tau = float(r.get("tau") or 1.0)
        step_ms = 1000.0 * batch * tau / float(r["tokens_per_s"])
        out.append(Measurement(batch, drafted, round(step_ms, 3), tau))
    return out


def fit_bench_records(
    records: Iterable[Mapping[str, Any]],
    *,
    temperature: float = 0.0,
    prefill_ms_per_token: float | None = None,
) -> LatencyModel:
    """fit() over measurements_from_bench(records)."""
    measured = measurements_from_bench(records, temperature)
    return fit(measured, prefill_ms_per_token=prefill_ms_per_token)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, help="docs/benchmarks/speculative.json")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prefill-ms-per-token", type=float, default=None)
    parser.add_argument(
        "--out", type=Path, default=default_docs() / "benchmarks" / "latency_model.json"
    )
    args = parser.parse_args(argv)
    records = json.loads(args.records.read_text(encoding="utf-8"))
    model = fit_bench_records(
        records, temperature=args.temperature, prefill_ms_per_token=args.prefill_ms_per_token
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(model.to_json() + "\n", encoding="utf-8")
    print(model.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run the reliability scenarios and render docs/reliability.md's table.

    python -m tests.reliability.run                     # all (about 15 minutes with vLLM)
    python -m tests.reliability.run --only faults_vllm  # one; replaces just its row
    python -m tests.reliability.run --list

Run from the repository root (`tests` is imported from there). Prints one line per
scenario, merges the records into docs/benchmarks/reliability.json and regenerates the
table in docs/reliability.md. docs/ is the repository's (found from this file, whatever
the working directory) unless --docs names another. Exit 1 when a scenario lost a request,
answered 5xx or failed one of its CHECKS (a victim's TPOT past 1.2x, replica deaths past
their bound). The fuzz scenario needs hypothesis (a dev dependency: install.sh --dev).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentserve_bench.report import replace_section

from tests.reliability import (
    faults,
    fuzz,
    hostile_input,
    hostile_lists,
    keeper_faults,
    memory_amplification,
    poison_accounting,
    slow_bodies,
    structured_outputs,
    tenants,
    tool_schemas,
    vllm_faults,
)
from tests.reliability.scenario import Outcome, scenarios_in

__all__ = ["DOCS", "all_scenarios", "failed", "main", "markdown_table", "run_scenarios"]

MODULES = (
    faults,
    hostile_input,
    hostile_lists,
    structured_outputs,
    slow_bodies,
    poison_accounting,
    fuzz,
    tenants,
    keeper_faults,
    memory_amplification,
    tool_schemas,
    vllm_faults,
)
DOCS = Path(__file__).resolve().parents[2] / "docs"
COMMAND = "python -m tests.reliability.run"
# details a scenario may set; False fails the run like a lost request
CHECKS = ("tpot_within_1_2x", "deaths_within_bound")


def all_scenarios() -> dict[str, Callable[..., Outcome]]:
    """Every scenario of the fake-engine modules and the real-vLLM one, by name."""
    return scenarios_in(MODULES)


def run_scenarios(names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the named scenarios (all when None); returns name -> record."""
    known = all_scenarios()
    unknown = sorted(set(names or []) - set(known))
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {sorted(known)}")
    records: dict[str, dict[str, Any]] = {}
    for name in names or sorted(known):
        print(f"[reliability] {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        outcome = known[name]()
        record = asdict(outcome) | {"wall_s": round(time.perf_counter() - start, 1)}
        records[name] = record
        print(
            f"[reliability] {name}: requests={outcome.requests} lost={outcome.lost} "
            f"5xx={outcome.errors_5xx} restarts={outcome.restarts} ({record['wall_s']} s)",
            flush=True,
        )
    return records


def markdown_table(records: dict[str, dict[str, Any]]) -> str:
    rows = ["| scenario | engine | requests | lost | 5xx | restarts | wall s |"]
    rows.append("|---|---|---|---|---|---|---|")
    for name, r in sorted(records.items()):
        rows.append(
            f"| {name} | {r['engine']} | {r['requests']} | {r['lost']} | {r['errors_5xx']} "
            f"| {r['restarts']} | {r['wall_s']} |"
        )
    return "\n".join(rows)


def write_docs(records: dict[str, dict[str, Any]], docs: Path) -> Path:
    """Merge `records` into docs/benchmarks/reliability.json and regenerate the table of
    docs/reliability.md from the merged records; returns the JSON path."""
    out = docs / "benchmarks" / "reliability.json"
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged.update(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    body = (
        f"Command: `{COMMAND}` (all scenarios, about 15 minutes with the real-vLLM one; "
        "`--only NAME` reruns one and replaces just its row)\n\n" + markdown_table(merged)
    )
    replace_section(docs / "reliability.md", "reliability-table", body)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Runs the reliability scenarios (the same functions the test suite "
        "asserts on), prints one line per scenario, merges the records into "
        "docs/benchmarks/reliability.json and regenerates the table in docs/reliability.md.",
    )
    parser.add_argument("--only", action="append", help="run just this scenario (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--docs",
        type=Path,
        default=DOCS,
        help="where reliability.md and benchmarks/ live (default: the repository's docs/)",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, fn in sorted(all_scenarios().items()):
            doc = (fn.__doc__ or "").strip().splitlines()
            print(f"{name}: {doc[0] if doc else ''}")
        return 0
    records = run_scenarios(args.only)
    out = write_docs(records, args.docs)
    print(f"wrote {out} and the table in {args.docs / 'reliability.md'}")
    failures = {name: why for name, r in records.items() if (why := failed(r))}
    for name, why in failures.items():
        print(f"[reliability] {name} FAILED: {', '.join(why)}", file=sys.stderr)
    return 1 if failures else 0


def failed(record: dict[str, Any]) -> list[str]:
    """Why a record fails: lost requests, 5xx, or a CHECKS detail that is False."""
    why = [f"{key}={record[key]}" for key in ("lost", "errors_5xx") if record[key]]
    details = record.get("details") or {}
    return why + [f"{key} is False" for key in CHECKS if details.get(key) is False]


if __name__ == "__main__":
    raise SystemExit(main())

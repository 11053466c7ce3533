"""`agentserve bench reliability`: run the fault, hostile-input and tenant scenarios and
record what each one saw (requests sent, lost, 5xx responses, replica restarts).

A scenario is a plain function registered with `@scenario("name")`; it returns a
`Outcome`. Tests call the same functions and assert on the outcome, so the figures in
docs/benchmarks/reliability.json come from exactly the code the test suite checks.
Scenario modules: agentserve.bench.reliability_faults, agentserve.bench.reliability_input,
agentserve.bench.reliability_fuzz, agentserve.bench.reliability_tenants (fake engine)
and agentserve.bench.reliability_vllm (real vLLM replicas). Every record names its engine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SCENARIOS", "Outcome", "add_parser", "run_scenarios", "scenario"]

SCENARIO_MODULES = (
    "agentserve.bench.reliability_faults",
    "agentserve.bench.reliability_input",
    "agentserve.bench.reliability_fuzz",
    "agentserve.bench.reliability_tenants",
    "agentserve.bench.reliability_vllm",
)


@dataclass
class Outcome:
    """What one scenario saw. `lost` counts requests that got no complete answer (no
    response, a truncated stream, or a 5xx where a 4xx/2xx was due)."""

    requests: int
    lost: int
    errors_5xx: int
    restarts: int
    details: dict[str, Any] = field(default_factory=dict)
    engine: str = "fake"  # the replicas' engine: "fake" (deterministic) or "vllm" (real)

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.errors_5xx == 0


SCENARIOS: dict[str, Callable[..., Outcome]] = {}


def scenario(name: str) -> Callable[[Callable[..., Outcome]], Callable[..., Outcome]]:
    """Register a scenario under `name` (a test id-like string, unique)."""

    def register(fn: Callable[..., Outcome]) -> Callable[..., Outcome]:
        if name in SCENARIOS and SCENARIOS[name] is not fn:
            raise ValueError(f"reliability scenario {name!r} registered twice")
        SCENARIOS[name] = fn
        return fn

    return register


def load_scenarios() -> dict[str, Callable[..., Outcome]]:
    for module in SCENARIO_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return dict(SCENARIOS)


def run_scenarios(names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the named scenarios (all when None); returns name -> record."""
    known = load_scenarios()
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


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "reliability",
        help="chaos, fuzz and tenant-isolation scenarios; requests, lost, 5xx, restarts",
        description="Runs the reliability scenarios (the same functions the test suite "
        "asserts on), prints one line per scenario, merges the records into "
        "docs/benchmarks/reliability.json and regenerates the table in docs/reliability.md.",
    )
    p.add_argument("--only", action="append", help="run just this scenario (repeatable)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument(
        "--docs", default="docs", help="where reliability.md and benchmarks/ live (%(default)s)"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from agentserve.bench.report import replace_section

    if args.list:
        for name, fn in sorted(load_scenarios().items()):
            print(f"{name}: {(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}")
        return 0
    records = run_scenarios(args.only)
    docs = Path(args.docs)
    out = docs / "benchmarks" / "reliability.json"
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged.update(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    body = (
        "Command: `agentserve bench reliability` (all scenarios, about 15 minutes with the "
        "real-vLLM one; `--only NAME` reruns one and replaces just its row)\n\n"
        + markdown_table(merged)
    )
    replace_section(docs / "reliability.md", "reliability-table", body)
    print(f"wrote {out} and the table in {docs / 'reliability.md'}")
    return (
        0
        if all(
            Outcome(**{k: r[k] for k in ("requests", "lost", "errors_5xx", "restarts")}).clean
            for r in records.values()
        )
        else 1
    )

"""The options of `agentserve bench speculative-served` (agentserve_bench.speculative_served)."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentserve_bench.arg_types import floats, ints
from agentserve_bench.heldout_workloads import HALVES
from agentserve_bench.settings_bundles import SETTINGS, default_settings

__all__ = ["add_arguments", "halves"]


def halves(text: str) -> list[str]:
    """--halves: a comma list of heldout_workloads.HALVES."""
    out = [h for h in text.split(",") if h]
    unknown = [h for h in out if h not in HALVES]
    if unknown or not out:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(HALVES)}, not {text!r}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of the served benchmark, on its subcommand's parser."""
    from agentserve_bench.report import default_docs
    from agentserve_bench.served_client import WORKLOADS

    p.add_argument(
        "--methods",
        default="ngram:4,dflash:3",
        help="comma list of METHOD[:k] served by agentserve; plain decoding (none) always runs "
        "first (default: %(default)s)",
    )
    p.add_argument(
        "--peer-methods",
        default="none",
        help="methods vLLM's own server runs too ('' for none) (default: %(default)s)",
    )
    p.add_argument(
        "--workloads",
        type=lambda t: [w for w in t.split(",") if w],
        default=["coding", "agent"],
        help=f"comma list of {', '.join(WORKLOADS)}: write (a function from its "
        "description: little to copy), edit (a given function changed: mostly copied), explain "
        "(prose about a given function) (default: %(default)s)",
    )
    p.add_argument(
        "--halves",
        type=halves,
        default=list(HALVES),
        help="comma list of workload halves to send (heldout_workloads.half_of: a fixed hash "
        "of each function's name); the default method is chosen from 'tune' rows only, the "
        "docs report both, 'report' marked (default: tune,report)",
    )
    p.add_argument("--concurrency", type=ints, default=[1, 4], help="comma list (default: 1,4)")
    p.add_argument(
        "--temperatures",
        type=floats,
        default=[0.0],
        help="comma list of sampling temperatures (default: 0 = greedy, where replies are "
        "checked against plain decoding's); rows at T > 0 are compared with plain decoding "
        "at the same T and never decide the default",
    )
    p.add_argument(
        "--settings",
        type=lambda t: [x for x in t.split(",") if x],
        default=None,
        help="comma list of named CPU engine settings to compare, each running every method "
        f"(agentserve_bench.settings_bundles.SETTINGS: {', '.join(SETTINGS)}); the default method "
        "is chosen from the rows of the settings agentserve up applies on this kind of CPU "
        "(default: those settings, here "
        f"{default_settings()!r})",
    )
    p.add_argument(
        "--num-prompts", type=int, default=12, help="conversations per workload (default: 12)"
    )
    p.add_argument("--max-tokens", type=int, default=128, help="per request (default: 128)")
    p.add_argument(
        "--dtypes",
        type=lambda t: [x or None for x in t.split(",")],
        default=[None],
        help="comma list of model dtypes to compare ('' = the one agentserve up serves in on "
        "this kind of CPU: its profile (agentserve/profiles), else the spec's bfloat16); rows "
        "of a dtype named here are labelled SETTINGS/DTYPE and never decide the default "
        "(default: '')",
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "fake"),
        default="vllm",
        help="fake: the whole path with a stand-in engine, for testing the benchmark "
        "(default: %(default)s)",
    )
    p.add_argument("--port", type=int, default=8719, help="agentserve's port (default: 8719)")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="(default: 900)")
    p.add_argument(
        "--metrics-settle-s",
        type=float,
        default=3.0,
        help="wait before reading counters after a level (default: 3)",
    )
    p.add_argument(
        "--keep-other-rows",
        action="store_true",
        help="keep the committed served rows of (server, settings) pairs this run does not "
        "measure (each row carries its own command and date); default: replace all served rows "
        "of this kind of CPU (another kind's rows always stay: each kind has its own default)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: re-derive ratios, default flags and the docs section from the "
        "committed served rows (after the default settings or the rule changed)",
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="DFlash drafter directory for the dflash and hybrid rows, e.g. a candidate from "
        "`agentserve train-drafter --out DIR` (default: the shipped drafter); pair it with "
        "--docs DIR to keep the committed figures",
    )
    p.add_argument(
        "--schedule",
        choices=("auto", "off"),
        default="auto",
        help="auto: each method drafts as `agentserve up` runs it (the speculation schedule "
        "may turn drafting down, or off, by batch size); off: k drafts at every batch, to "
        "measure what a drafter can do (rows say so, and never decide the default) "
        "(default: %(default)s)",
    )
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")

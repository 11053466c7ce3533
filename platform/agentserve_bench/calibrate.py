"""`agentserve bench calibrate`: record this machine's step-cost profile and the choice the
embedded default makes from it, into docs/benchmarks/calibration.json and benchmarks.md.

The profile is what `agentserve up` measures at a first start on a kind of CPU without
served figures (engine/step_costs.py); recording it here lets the decision logic be tested
against real profiles of each kind of machine, and lets served_fits.served_factors
compare the prediction with the served benchmark where both exist.

Each kind of CPU is recorded on a machine of that kind: the GEMMs are vLLM's own CPU
dispatch (pre-packed for the CPU it runs on), which aborts when oneDNN is held to a lower
ISA (ONEDNN_MAX_CPU_ISA), and torch's fallback GEMMs are far slower than vLLM's on AVX2
bf16, so no emulated profile stands in for a machine that was not measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "calibration_section", "run"]

_MEASURE = (
    "import json, sys\n"
    "from agentserve.engine.step_costs import measure_profile\n"
    "print(json.dumps(measure_profile(sys.argv[1], progress=lambda t: print(t, file=sys.stderr))))"
)


def measure(model_dir: Path) -> dict[str, Any]:
    """A profile measured in a fresh process (as `agentserve up` measures it: nothing
    else imported or warmed up)."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(model_dir)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _choice(profile: dict[str, Any]) -> dict[str, Any]:
    from agentserve.drafters import BUNDLED_DRAFTER_DIR
    from agentserve.speculation.choice import choose_served, drafter_fraction
    from agentserve.speculation.schedule import method_acceptance

    drafting = drafter_fraction(BUNDLED_DRAFTER_DIR) or 0.0  # hybrid drafts every step too
    fractions = {"ngram": 0.0, "dflash": drafting, "hybrid": drafting}
    choice = choose_served(profile, method_acceptance(), fractions)
    return {k: v for k, v in choice.as_dict().items() if k != "candidates"}


def run(args: argparse.Namespace) -> int:
    from agentserve.sources.models import BUNDLED_MODEL, resolve_model

    docs = Path(args.docs)
    path = docs / "benchmarks" / "calibration.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    if not args.report_only:
        model_dir = resolve_model(BUNDLED_MODEL, progress=True)
        started = time.perf_counter()
        profile = measure(model_dir)
        profile["date"] = time.strftime("%Y-%m-%d")
        profile["command"] = "agentserve bench calibrate"
        profile["choice"] = _choice(profile)
        machine = profile["machine"]["cpu_class"]
        print(f"{machine}: {time.perf_counter() - started:.1f} s; {profile['choice']['reason']}")
        rows = [r for r in rows if r["machine"]["cpu_class"] != machine] + [profile]
    for row in rows:  # the choice as the current logic makes it (--report-only: after a change)
        row["choice"] = _choice(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    _write_profiles(docs, rows)
    from agentserve_bench.report import replace_section

    replace_section(docs / "benchmarks.md", "calibration", calibration_section(rows))
    print(calibration_section(rows))
    return 0


def _write_profiles(docs: Path, rows: list[dict[str, Any]]) -> None:
    """Each measured kind's `step_terms` and the pooled served factors into the profiles
    (the served factors pair these profiles with the served rows of speculative.json)."""
    from agentserve.autoscale.calibrated_model import step_terms
    from agentserve.drafters import BUNDLED_DRAFTER_DIR
    from agentserve.profiles import POOLED
    from agentserve.speculation.choice import LOADED_BATCH, drafter_fraction

    from agentserve_bench.profile_write import profile_dir, write_profile_section
    from agentserve_bench.served_fits import served_factors, served_step_factor
    from agentserve_bench.served_rows import rows_of_shipped_drafter

    directory = profile_dir(docs)
    if directory is None:
        return
    source = "docs/benchmarks/calibration.json"
    for r in rows:
        if r.get("emulated"):
            continue
        terms = {d: dict(zip(_TERMS, step_terms(r, d), strict=True)) for d in r["dtypes"]}
        write_profile_section(
            r["machine"]["cpu_class"], "step_terms", terms, r["command"], source, directory,
            r.get("date"),
        )  # fmt: skip
    served = rows_of_shipped_drafter(
        json.loads((docs / "benchmarks" / "speculative.json").read_text())
    )
    drafting = drafter_fraction(BUNDLED_DRAFTER_DIR) or 0.0
    fractions = {"ngram": 0.0, "dflash": drafting, "hybrid": drafting}
    factors = {
        "batch_1": served_factors(rows, served, fractions),
        "loaded": served_factors(rows, served, fractions, LOADED_BATCH),
        "step": served_step_factor(rows, served),
    }
    write_profile_section(
        POOLED, "served_factor", factors,
        "agentserve bench calibrate ; agentserve bench speculative-served",
        f"{source}, docs/benchmarks/speculative.json", directory,
        max(r.get("date", "") for r in [*rows, *served]) or None,
    )  # fmt: skip


_TERMS = ("base_ms", "knee_tokens", "per_token_ms")


def calibration_section(rows: list[dict[str, Any]]) -> str:
    """The benchmarks.md section: per profile, decode and k=4 verification costs per dtype
    (batch 1 and 4), prefill per token, and the choice made from them."""
    lines = [
        "## Step-cost calibration (the embedded default on an unmeasured CPU)",
        "",
        "`agentserve bench calibrate`: the GEMM part (vLLM's own CPU GEMMs) of a decode step",
        "and of a k=4 verification step (5 tokens per sequence) of the bundled model, per",
        "dtype, and the choice `agentserve up` makes from it where no served figures exist for",
        "the kind of CPU (agentserve/speculation/calibration.py). One row per kind measured.",
        "",
        "| CPU | dtype | decode ms b=1 | verify k=4 / decode b=1 | b=4 | prefill ms/token "
        "| choice | predicted | date |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = r["machine"]["cpu_class"] + (
            f" (emulated {r['emulated']})" if r.get("emulated") else ""
        )
        c = r.get("choice") or {}
        pick = f"{c.get('method') or 'plain'} k={c.get('num_speculative_tokens')} {c.get('dtype')}"
        for dtype, costs in r["dtypes"].items():
            s1, s4 = costs["step_ms"]["1"], costs["step_ms"].get("4", {})
            ratio4 = f"{s4['5'] / s4['1']:.2f}" if s4 else "-"
            lines.append(
                f"| {cpu} | {dtype} | {s1['1']:.1f} | {s1['5'] / s1['1']:.2f} | {ratio4} "
                f"| {costs['prefill_ms_per_token']:.3f} | {pick} "
                f"| {c.get('predicted_speedup', 1.0):.2f}x | {r.get('date', '')} |"
            )
    from agentserve.drafters import default_speculation, has_served_speculation
    from agentserve.sources.models import BUNDLED_MODEL
    from agentserve.speculation.choice import measured_served_factors

    served_factor, served_factor_loaded = measured_served_factors()

    def _factors(table: dict[str, float]) -> str:
        return ", ".join(f"{m} {f:.2f}" for m, f in sorted(table.items()))

    def _agrees(r: dict[str, Any]) -> bool:  # the served default, where there is one
        machine = r["machine"]["cpu_class"]
        chosen = (r.get("choice") or {}).get("method")
        measured = has_served_speculation(BUNDLED_MODEL, machine)
        return measured and default_speculation(BUNDLED_MODEL, machine) == chosen

    agree = sorted(r["machine"]["cpu_class"] for r in rows if not r.get("emulated") and _agrees(r))
    lines += [
        "",
        "The rule (agentserve/speculation/choice.py): per dtype, method and k, predicted speedup",
        "= tau(k) x decode / (verify(k) x (1 + drafting share)) x the method's served factor;",
        "speculation only where that is >= 1.15x at batch 1 and >= 1.0x at batch 4, and the",
        "dtype with the shortest nominal agent turn (512-token prefill, 128 tokens out). The",
        "served factor is the measured served speedup over the speedup predicted from the",
        "profile with the row's own tau and drafting share, the lowest over the served rows",
        "of the default engine settings, at concurrency 1 for batch 1",
        f"({_factors(served_factor)}) and at concurrency 4 for batch 4",
        f"({_factors(served_factor_loaded)}): vLLM's whole speculative step costs more than",
        "its GEMMs and the drafting, and its fixed part weighs less in a bigger batch. On a",
        "kind of CPU with served figures (its profile) those decide; the calibrated",
        f"method agrees with them on {', '.join(agree) or 'none'}.",
    ]
    return "\n".join(lines)


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.report import default_docs

    p = kinds.add_parser(
        "calibrate",
        help="record this machine's step costs and the embedded default's choice from them",
        description="Times the GEMM part of decode and verification steps of the bundled "
        "model per dtype (what `agentserve up` measures on a CPU without served figures), "
        "and writes docs/benchmarks/calibration.json and the calibration section of "
        "benchmarks.md. Run it with nothing else on the machine.",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: recompute the choices in benchmarks/calibration.json (after a "
        "change of the logic) and rewrite the docs section",
    )
    p.add_argument("--docs", type=Path, default=default_docs(), help="(default: %(default)s)")
    p.set_defaults(handler=run)

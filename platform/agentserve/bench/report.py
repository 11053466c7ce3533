"""Turn benchmark cells into ratios, a JSON record list, a markdown table and a plot."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "finalize",
    "histogram_lines",
    "markdown_table",
    "plot_speedups",
    "replace_section",
    "write_json",
]


def _key(cell: dict[str, Any]) -> tuple:
    return cell["engine"], cell["temperature"], cell["batch_size"]


def finalize(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speedup_vs_no_spec and outputs_identical (greedy only) against the same engine's
    no-speculation cell at the same temperature and batch size; drop the raw outputs."""
    base = {_key(c): c for c in cells if c["method"] == "none"}
    records = []
    for cell in cells:
        ref = base.get(_key(cell))
        record = {k: v for k, v in cell.items() if k != "outputs"}
        record["speedup_vs_no_spec"] = (
            round(cell["tokens_per_s"] / ref["tokens_per_s"], 3) if ref else None
        )
        greedy = cell["temperature"] == 0 and ref is not None
        record["outputs_identical"] = (cell["outputs"] == ref["outputs"]) if greedy else None
        records.append(record)
    return records


def write_json(records: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2) + "\n")


def markdown_table(records: list[dict[str, Any]]) -> str:
    columns = ["engine", "method", "k", "T", "batch", "tokens/s", "speedup", "tau"]
    columns += ["greedy identical", "accept pos 1..4"]
    head = "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|\n"
    rows = []
    for r in records:
        same = {True: "yes", False: "**NO**", None: "-"}[r["outputs_identical"]]
        pos = ", ".join(str(a) for a in r["per_position_acceptance"][:4]) or "-"
        cells = [r["engine"], r["method"], r["num_speculative_tokens"], f"{r['temperature']:g}"]
        cells += [r["batch_size"], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_no_spec']:.2f}x"]
        cells += [f"{r['tau']:.2f}", same, pos]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return head + "\n".join(rows) + "\n"


def histogram_lines(records: list[dict[str, Any]]) -> str:
    """One line per speculative cell: how many steps emitted 1, 2, ... tokens."""
    lines = []
    for r in records:
        hist = r.get("tau_histogram") or {}
        if r["method"] == "none" or not hist:
            continue
        steps = sum(hist.values())
        shares = ", ".join(
            f"{n}: {c / steps:.0%}" for n, c in sorted(hist.items(), key=lambda x: int(x[0]))
        )
        lines.append(
            f"- {r['engine']} {r['method']}{r['num_speculative_tokens']} "
            f"T{r['temperature']:g} batch {r['batch_size']} ({steps} steps): {shares}"
        )
    return "\n".join(lines) + "\n"


def plot_speedups(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({r["engine"] for r in records})
    fig, axes = plt.subplots(1, len(engines), figsize=(6 * len(engines), 3.8), squeeze=False)
    for ax, engine in zip(axes[0], engines, strict=True):
        mine = [r for r in records if r["engine"] == engine and r["method"] != "none"]
        labels = [
            f"{r['method']}{r['num_speculative_tokens']}\nT{r['temperature']:g} b{r['batch_size']}"
            for r in mine
        ]
        ax.bar(
            range(len(mine)),
            [r["speedup_vs_no_spec"] for r in mine],
            color=["C0" if r["method"] == "dflash" else "C1" for r in mine],
        )
        ax.axhline(1.0, color="gray", lw=1, ls="--")
        ax.set_xticks(range(len(mine)), labels, fontsize=7)
        ax.set(ylabel="speedup vs no speculation", title=f"{engine}: tokens/s ratio")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replace_section(doc: Path, name: str, body: str) -> None:
    """Write body between <!-- name:begin --> and <!-- name:end --> (appending if absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = (
        doc.read_text()
        if doc.exists()
        else "# Benchmarks\n\nMeasured figures and the commands that produced them.\n"
    )
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)

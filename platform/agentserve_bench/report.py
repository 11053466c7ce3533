"""Turn benchmark cells into ratios, a JSON record list, a markdown table and a plot."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "default_docs",
    "finalize",
    "histogram_lines",
    "markdown_table",
    "measured_with",
    "paired_rounds",
    "plot_speedups",
    "replace_section",
    "write_json",
    "write_machine_rows",
]


def default_docs() -> Path:
    """The docs/ folder benchmarks write to by default: the repository's (this file is
    platform/agentserve_bench/report.py in a checkout), whatever the working directory. A
    copy installed outside a checkout has none beside it: then ./docs (pass --docs)."""
    repo_docs = Path(__file__).resolve().parents[2] / "docs"
    return repo_docs if repo_docs.is_dir() else Path("docs")


def _key(cell: dict[str, Any]) -> tuple:
    return _engine(cell), cell["temperature"], cell["batch_size"]


def _engine(cell: dict[str, Any]) -> str:
    """The engine label: cells of another dtype are their own baseline group."""
    dtype = cell.get("dtype", "bfloat16")
    return cell["engine"] if dtype == "bfloat16" else f"{cell['engine']} {dtype}"


def _divergence(outputs: list[list[int]], reference: list[list[int]]) -> dict[str, Any]:
    """How many prompts differ from the reference, and the earliest differing token."""
    first = []
    for mine, ref in zip(outputs, reference, strict=True):
        if mine != ref:
            same = (i for i, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b)
            first.append(next(same, min(len(mine), len(ref))))
    return {"prompts": len(first), "first_token": min(first) if first else None}


def finalize(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speedup_vs_no_spec and outputs_identical (greedy only) against the same engine's
    no-speculation cell at the same temperature and batch size; drop the raw outputs.

    Greedy cells also get `divergence` (prompts that differ from that baseline and the
    earliest differing token) and `identical_to_plain_batch`: the batch sizes whose plain
    decoding gives exactly this output. Plain decoding is not always batch-invariant in
    low precision (a different kernel shape can flip a near-tie argmax), so a speculative
    run that equals plain decoding at another batch size is a numerics effect, not a loss.
    """
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
        if greedy:
            record["divergence"] = _divergence(cell["outputs"], ref["outputs"])
            record["identical_to_plain_batch"] = sorted(
                key[2]
                for key, plain in base.items()
                if key[:2] == _key(cell)[:2] and plain["outputs"] == cell["outputs"]
            )
        records.append(record)
    return records


def _identity(r: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The "greedy identical" cell: plain rows say whether plain decoding itself gave the
    same output at every batch size; speculative rows compare with plain decoding."""
    if r["outputs_identical"] is None:
        return "-"
    other = r["identical_to_plain_batch"]
    if r["method"] == "none":
        same_run = [c for c in records if c["method"] == "none" and _key(c)[:2] == _key(r)[:2]]
        batches = {c["batch_size"] for c in same_run}
        apart = sorted(batches - set(other))
        return f"(plain; differs from batch {', '.join(map(str, apart))})" if apart else "(plain)"
    if r["outputs_identical"]:
        return "yes"
    if other:
        return f"= plain at batch {', '.join(map(str, other))}"
    d = r["divergence"]
    return f"**NO** ({d['prompts']} prompts, from token {d['first_token']})"


def write_json(
    records: list[dict[str, Any]],
    path: Path,
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> None:
    """Write `records` to `path`; with `keep`, the file's records it accepts stay first
    (benchmarks that share one figures file each replace only their own records)."""
    kept: list[dict[str, Any]] = []
    if keep is not None and path.exists():
        kept = [r for r in json.loads(path.read_text()) if keep(r)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept + records, indent=2) + "\n")


def markdown_table(records: list[dict[str, Any]]) -> str:
    columns = ["engine", "method", "k", "T", "batch", "tokens/s", "speedup", "tau"]
    columns += ["greedy identical", "accept pos 1..4"]
    head = "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|\n"
    rows = []
    for r in records:
        same = _identity(r, records)
        pos = ", ".join(str(a) for a in r["per_position_acceptance"][:4]) or "-"
        cells = [_engine(r), r["method"], r["num_speculative_tokens"], f"{r['temperature']:g}"]
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
            f"- {_engine(r)} {r['method']}{r['num_speculative_tokens']} "
            f"T{r['temperature']:g} batch {r['batch_size']} ({steps} steps): {shares}"
        )
    return "\n".join(lines) + "\n"


def plot_speedups(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({_engine(r) for r in records})
    fig, axes = plt.subplots(1, len(engines), figsize=(6 * len(engines), 3.8), squeeze=False)
    for ax, engine in zip(axes[0], engines, strict=True):
        mine = [r for r in records if _engine(r) == engine and r["method"] != "none"]
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


def write_machine_rows(
    docs: Path,
    stem: str,
    records: list[dict[str, Any]],
    cpu_class: str,
    render: Callable[[list[dict[str, Any]]], str],
) -> list[dict[str, Any]]:
    """Replace one kind of CPU's rows in docs/benchmarks/<stem>.json (other kinds' stay),
    rewrite the docs/benchmarks.md section <stem> as `render` makes it from all the rows,
    print where, and return all the rows."""
    path = Path(docs) / "benchmarks" / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in old if r.get("machine", {}).get("cpu_class") != cpu_class] + records
    path.write_text(json.dumps(rows, indent=1) + "\n")
    replace_section(Path(docs) / "benchmarks.md", stem, render(rows))
    print(f"written: {path}, {Path(docs) / 'benchmarks.md'} (section {stem})")
    return rows


def paired_rounds(
    rows: list[dict[str, Any]], arm: str, arms: tuple[Any, Any], keys: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Interleaved-round rows (each with "concurrency", "round" and `arm`) summarized per
    concurrency over the rounds both arms ran: for each key, the median per arm (in `arms`
    order), the median of the per-round ratios second arm / first, and in how many rounds
    that ratio was above 1 (pure). A drifting machine says something only in such pairs."""
    first, second = arms
    out = []
    for c in sorted({r["concurrency"] for r in rows}):
        at = {x: {r["round"]: r for r in rows if r["concurrency"] == c and r[arm] == x}
              for x in arms}  # fmt: skip
        rounds = sorted(set(at[first]) & set(at[second]))
        if not rounds:
            continue
        s: dict[str, Any] = {"kind": "summary", "concurrency": c, "rounds": len(rounds)}
        for key in keys:
            ratios = [at[second][i][key] / at[first][i][key] for i in rounds]
            s[key] = [statistics.median(at[x][i][key] for i in rounds) for x in arms]
            s[f"{key}_ratio_median"] = round(statistics.median(ratios), 3)
            s[f"{key}_higher_in_rounds"] = sum(x > 1 for x in ratios)
        out.append(s)
    return out


def measured_with(records: list[dict[str, Any]]) -> str:
    """ "Measured <dates> with `<commands>`" from the records that carry them (pure)."""
    commands = sorted({r["command"] for r in records if r.get("command")})
    dates = sorted({r["date"] for r in records if r.get("date")})
    return f"Measured {', '.join(dates)} with `{'`, `'.join(commands)}`"

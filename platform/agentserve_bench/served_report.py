"""Writing `agentserve bench speculative-served`'s figures: the served rows of
docs/benchmarks/speculative.json (offline and sampling rows stay) and the served table that
leads docs/benchmarks.md."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from agentserve_bench.process_cpu import cpu_line
from agentserve_bench.report import replace_section, write_json
from agentserve_bench.served_rows import by_machine, machine_default_settings, served_default
from agentserve_bench.settings_bundles import DEFAULT_SETTINGS

__all__ = ["SECTION", "markdown_table", "write_served"]

SECTION = "speculative-served"
_LEADS_BEFORE = "<!-- speculative:begin -->"


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _cpu(r: dict[str, Any]) -> str:
    return r.get("machine", {}).get("cpu_class", "-")


def markdown_table(records: list[dict[str, Any]]) -> str:
    head = (
        "| CPU | server | settings | dtype | method | k | workload | half | T | c | decode tok/s "
        "| vs plain | throughput vs plain | TTFT p50 ms | tau | greedy = plain | default |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in records:
        speedup = r.get("speedup_vs_plain")
        lines.append(
            f"| {_cpu(r)} | {r['server']} | {r.get('settings', DEFAULT_SETTINGS)} | {r['dtype']} "
            f"| {r['method']} "
            f"| {r['num_speculative_tokens']} | {r['workload']} | {r.get('half', '-')} "
            f"| {r.get('temperature', 0.0):g} | {r['concurrency']} "
            f"| {_fmt(r['decode_tokens_per_s'], 1)} "
            f"| {_fmt(speedup)}{'x' if speedup else ''} | {_fmt(r.get('throughput_vs_plain'))} "
            f"| {_fmt(r['ttft_ms_p50'], 0)} | {_fmt(r['tau'])} | {r.get('greedy_identical', '-')} "
            f"| {'**yes**' if r.get('default') else ''} |"
        )
    return head + "\n".join(lines) + "\n"


def _figure(r: dict[str, Any]) -> float | None:
    """What a ratio compares: decode tok/s at concurrency 1 (one stream's speed), aggregate
    tok/s above it (what the server delivers to many)."""
    return r["decode_tokens_per_s"] if r["concurrency"] == 1 else r["throughput_tokens_per_s"]


def _ratio_line(records: list[dict[str, Any]], title: str, pairs: list[tuple[str, str]]) -> str:
    """`title` and ratios between rows of one run (`_figure`): for each (numerator,
    denominator) pair of "server/method" names, per kind of CPU, workload, half and
    concurrency, at the settings `agentserve up` applies on that kind of CPU; "" when no pair
    meets."""
    figure = {
        (_cpu(r), f"{r['server']}/{r['method']}", _where(r), r["concurrency"]): _figure(r)
        for r in records
        if r.get("settings", DEFAULT_SETTINGS) == machine_default_settings(r)
    }
    parts = []
    for (cpu, name, where, c), ours in sorted(figure.items(), key=str):
        for numerator, denominator in pairs:
            theirs = figure.get((cpu, denominator, where, c))
            if name == numerator and ours and theirs:
                label = numerator.split("/")[1] + " " if len(pairs) > 1 else ""
                parts.append(f"{cpu} {label}{where} c={c}: {ours / theirs:.2f}x")
    return f"{title}: " + ", ".join(parts) if parts else ""


def _where(r: dict[str, Any]) -> str:
    """A row's workload as ratio lines name it: workload[/half][ T=t] (t when sampled)."""
    where = f"{r['workload']}/{r['half']}" if r.get("half") else r["workload"]
    return where + (f" T={r['temperature']:g}" if r.get("temperature") else "")


def _peer_line(records: list[dict[str, Any]]) -> str:
    """Plain agentserve vs plain vLLM server, per workload and concurrency."""
    return _ratio_line(
        records,
        "Plain agentserve vs plain vLLM server (decode tok/s at c=1, aggregate above)",
        [("agentserve/none", "vllm_serve/none")],
    )


def _spec_peer_line(records: list[dict[str, Any]]) -> str:
    """Each speculative method through agentserve vs vLLM's server running the same
    speculative config (the row's `speculative_config`), per cell."""
    methods = sorted({r["method"] for r in records if r["server"] == "vllm_serve"} - {"none"})
    return _ratio_line(
        records,
        "Speculation: agentserve vs vLLM's server with the same speculative config "
        "(decode tok/s at c=1, aggregate above)",
        [(f"agentserve/{m}", f"vllm_serve/{m}") for m in methods],
    )


def _vs_ngram_line(records: list[dict[str, Any]]) -> str:
    """DFlash and hybrid drafting vs n-gram drafting through agentserve, per cell."""
    return _ratio_line(
        records,
        "DFlash and hybrid vs n-gram through agentserve (decode tok/s)",
        [("agentserve/dflash", "agentserve/ngram"), ("agentserve/hybrid", "agentserve/ngram")],
    )


def write_served(
    records: list[dict[str, Any]],
    scores: dict[str, dict[str, Any]],
    default: str,
    docs: Path,
    *,
    command: str,
    wall_s: float,
    machine: dict[str, Any],
    keep_served: Any = None,
) -> list[Path]:
    """Write the records (texts as digests) and the section; returns the paths written."""
    date = time.strftime("%Y-%m-%d")
    saved = [
        {
            **{k: v for k, v in r.items() if k not in ("texts", "text_digests")},
            "text_digests": r.get("text_digests") or [_digest(t) for t in r["texts"]],
            "date": r.get("date", date),
            "command": r.get("command", command),
        }
        for r in records
    ]
    figures = docs / "benchmarks" / "speculative.json"
    keep = keep_served or (lambda r: False)
    kept = []
    if figures.exists():
        kept = [r for r in json.loads(figures.read_text()) if r.get("path") == "served" and keep(r)]
    write_json(saved, figures, keep=lambda r: r.get("path") != "served" or keep(r))
    records = [*kept, *records]  # the table shows the kept rows too (each has its command)
    envs = {r.get("settings", DEFAULT_SETTINGS): r["engine_env"] for r in records}
    env_text = "; ".join(f"{name}: `{env}`" for name, env in envs.items())
    took = f"; {wall_s:.0f} s" if wall_s else ""
    score_lines = []
    for cpu_class, rows in sorted(by_machine(records).items()):  # each kind decides alone
        chosen, by_method = (
            (default, scores) if cpu_class == machine["cpu_class"] else served_default(rows)
        )
        score_text = ", ".join(
            f"{m}:{s['k']} {s['score']:.2f}x{'' if s['passes'] else ' (fails the bar)'}"
            for m, s in sorted(by_method.items())
        )
        score_lines.append(
            f"- `{cpu_class}`: {score_text or 'none measured'}. **Default: {chosen}.**"
        )
    body = (
        "## Speculation through the server (the source of truth for the default)\n\n"
        f"Command: `{command}` ({date}{took}). Machines: {_machines(records, machine)}. "
        f"Engine environment by settings: {env_text}. Raw figures: the "
        '`"path": "served"` '
        "rows of `benchmarks/speculative.json`.\n\n"
        "Every row is streamed through the HTTP API (greedy, held-out conversations, "
        "decode tok/s = mean over requests of output tokens after the first / time from first "
        "to last chunk). Ratios are to the same server's plain decoding at the same workload "
        "and concurrency and temperature (T), in this run.\n\n"
        f"{markdown_table(records)}\n"
        f"{_peer_line(records)}\n\n"
        f"{_spec_peer_line(records)}\n\n"
        f"{_vs_ngram_line(records)}\n\n"
        + (f"{cpu_line(records)}\n\n" if cpu_line(records) else "")
        + "Method scores per kind of CPU, from the rows of the settings `agentserve up` applies "
        "there (geometric mean of speedups; the bar: >= 1.05x at c=1 and >= 0.97x at higher "
        "concurrency on every workload):\n\n" + "\n".join(score_lines) + "\n"
    )
    doc = docs / "benchmarks.md"
    _ensure_leading(doc)
    replace_section(doc, SECTION, body)
    return [figures, doc]


def _machines(records: list[dict[str, Any]], current: dict[str, Any]) -> str:
    """Each kind of CPU in the table: the machine that measured it, and when."""
    seen = {_cpu(r): (r.get("machine") or current, r.get("date", "")) for r in records}
    return "; ".join(
        f"`{cpu_class}` {m['model']}, {m['cores']} cores, features "
        f"{', '.join(m['features']) or 'none'} ({when or 'this run'})"
        for cpu_class, (m, when) in sorted(seen.items())
    )


def _ensure_leading(doc: Path) -> None:
    """Put empty served markers before the offline section, so the served table leads."""
    begin = f"<!-- {SECTION}:begin -->"
    if not doc.exists():
        return
    text = doc.read_text()
    if begin in text or _LEADS_BEFORE not in text:
        return
    block = f"{begin}\n<!-- {SECTION}:end -->\n\n"
    doc.write_text(re.sub(re.escape(_LEADS_BEFORE), lambda _: block + _LEADS_BEFORE, text, count=1))

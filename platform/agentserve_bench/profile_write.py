"""Write what a benchmark measured into its kind of machine's profile (agentserve/profiles).

A re-measure updates the profile, not code: each bench that decides a value calls
`write_profile_section` where it writes its rows, with the command that ran and the
docs/benchmarks file holding the rows; the merged profile is validated before it is written.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from agentserve.profiles import PROFILE_DIR, MachineProfile, machine_profile

__all__ = ["profile_dir", "write_profile_section", "write_served_profiles"]


def profile_dir(docs: Path) -> Path | None:
    """The profiles of the checkout whose docs/ a bench writes to (`docs`), or None where
    `docs` is not a checkout's (a side run into another folder leaves the profiles alone)."""
    found = Path(docs).resolve().parent / "platform" / "agentserve" / "profiles"
    return found if found.is_dir() else None


def write_profile_section(
    machine: str,
    section: str,
    values: Any,
    command: str,
    rows: str,
    directory: Path = PROFILE_DIR,
    date: str | None = None,
) -> Path:
    """Set `section` of `machine`'s profile (a cpu_class, or profiles.POOLED) to `values`,
    measured by `command` on `date` (default: today, UTC) with its rows in `rows`; the other
    sections stay. Returns the file written; ValueError (pydantic's) for values the profile
    does not accept, before anything is written."""
    path = directory / f"{machine}.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data["machine"] = machine
    when = date or datetime.datetime.now(datetime.UTC).date().isoformat()
    data[section] = {"values": values, "source": {"command": command, "date": when, "rows": rows}}
    MachineProfile.model_validate(data)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    machine_profile.cache_clear()  # this process reads what it wrote
    return path


SERVED_ROWS = "docs/benchmarks/speculative.json"


def write_served_profiles(
    records: list[dict[str, Any]], machines: set[str] | None = None, directory: Path = PROFILE_DIR
) -> list[Path]:
    """From served rows (every kind of machine's, the shipped drafter's): each kind's
    (or only `machines`') default speculation for the bundled model, decided from its own
    rows (served_rows.served_default), and the pooled acceptance and draft rate over every
    kind's rows. Each section's source is the command and latest date of its rows."""
    from agentserve.profiles import POOLED
    from agentserve.sources.models import BUNDLED_MODEL

    from agentserve_bench.served_fits import acceptance_from_served, draft_rate_from_served
    from agentserve_bench.served_rows import by_machine, deciding, served_default

    written = []
    for machine, rows in by_machine(r for r in records if r.get("path") == "served").items():
        used = [r for r in rows if deciding(r)]
        if (machines is not None and machine not in machines) or not used:
            continue
        best, scores = served_default(rows)
        dtypes = {r.get("dtype", "bfloat16") for r in used}
        values = {
            "method": None if best == "none" else best,
            "num_speculative_tokens": scores[best]["k"] if best in scores else None,
            "dtype": None if dtypes == {"bfloat16"} else dtypes.pop(),
        }
        written.append(_from_rows(machine, "speculation", {BUNDLED_MODEL: values}, used, directory))
    agentserve = [r for r in records if r.get("server") == "agentserve" and r.get("command")]
    acceptance = {
        m: {"alpha_1": a, "drop_per_doubling": d}
        for m, (a, d) in acceptance_from_served(records).items()
    }
    written.append(_from_rows(POOLED, "acceptance", acceptance, agentserve, directory))
    rates = draft_rate_from_served(records)
    written.append(_from_rows(POOLED, "draft_rate", rates, agentserve, directory))
    return written


def _from_rows(machine, section, values, rows, directory) -> Path:
    """write_profile_section with the source of `rows`: their commands and latest date."""
    command = " ; ".join(sorted({r.get("command", "") for r in rows} - {""}))
    date = max((r.get("date", "") for r in rows), default="") or None
    return write_profile_section(machine, section, values, command, SERVED_ROWS, directory, date)


def engine_values(settings: str) -> dict[str, Any]:
    """The profile's `engine` values of a named settings bundle (settings_bundles.SETTINGS)."""
    from agentserve_bench.settings_bundles import SETTINGS

    bundle = SETTINGS[settings]
    return {
        "executor": bundle["AGENTSERVE_CPU_EXECUTOR"],
        "allocator": bundle["AGENTSERVE_CPU_MALLOC"],
        "quiet_ray": bundle["AGENTSERVE_RAY_ENV"] == "quiet",
    }


def write_engine_profile(
    machine: str, records: list[dict[str, Any]], command: str, directory: Path = PROFILE_DIR
) -> Path | None:
    """From one run's served rows on `machine` comparing two or more named settings
    bundles: the bundle serving the shortest reply (served_rows.settings_scores) as the
    kind's `engine` section; None (nothing written) where the run compared fewer, or its
    best is a variant (another dtype, the schedule off) rather than a named bundle."""
    from agentserve_bench.served_rows import settings_scores
    from agentserve_bench.settings_bundles import SETTINGS

    scores = settings_scores(records)
    timed = {name: s for name, s in scores.items() if s.get("reply_s") is not None}
    if len(timed) < 2:
        return None
    best = min(timed, key=lambda name: timed[name]["reply_s"])
    if best not in SETTINGS:
        return None
    return write_profile_section(
        machine, "engine", engine_values(best), command, SERVED_ROWS, directory
    )

"""The machine profiles: the loader (valid, unknown, malformed), every shipped profile valid,
the bench's writer, and each profile's sources pointing at rows in the repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentserve import profiles
from agentserve.engine.cpu_info import CPU_CLASSES
from agentserve.profiles import MachineProfile, ProfileError, load_profile, machine_profile
from agentserve_bench.profile_write import profile_dir, write_profile_section

REPO = Path(__file__).resolve().parents[4]
SHIPPED = sorted(profiles.PROFILE_DIR.glob("*.json"))


def _write(directory: Path, machine: str, data) -> Path:
    path = directory / f"{machine}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_valid_file_loads_with_its_sections(tmp_path):
    source = {"command": "agentserve bench startup", "date": "2026-11-27", "rows": "x.json"}
    _write(tmp_path, "avx2", {"machine": "avx2", "compile": {"values": False, "source": source}})
    got = machine_profile("avx2", tmp_path)
    assert got.value("compile") is False and got.compile.source.command == source["command"]
    assert got.value("speculation") is None  # a section not measured


def test_an_unmeasured_kind_of_machine_has_no_profile(tmp_path):
    assert machine_profile("avx512", tmp_path) is None
    assert profiles.section("a-kind-never-measured", "engine") is None


@pytest.mark.parametrize(
    "text, says",
    [
        ("{not json", "not a valid machine profile"),
        ('{"machine": "amx", "speed": 3}', "speed"),  # unknown section
        ('{"machine": "amx", "compile": {"values": true}}', "source"),  # no provenance
        ('{"machine": "amx", "engine": {"values": {"executor": "threads", "allocator": '
         '"glibc", "quiet_ray": true}, "source": {"command": "c", "date": "d", "rows": "r"}}}',
         "executor"),
    ],
)  # fmt: skip
def test_a_malformed_file_is_a_clear_error_naming_it(tmp_path, text, says):
    path = _write(tmp_path, "amx", text)
    with pytest.raises(ProfileError, match=says) as err:
        load_profile(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_profile_validates_and_names_its_kind(path):
    profile = load_profile(path)
    assert profile.machine == path.stem
    assert path.stem in (*CPU_CLASSES, "cuda", profiles.POOLED)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_section_cites_a_command_a_date_and_rows_in_the_repository(path):
    profile = load_profile(path)
    sections = [getattr(profile, name) for name in MachineProfile.model_fields]
    for section in (s for s in sections if hasattr(s, "source")):
        assert section.source.command.startswith("agentserve bench ")
        assert len(section.source.date) == 10 and section.source.date.startswith("20")
        for rows in section.source.rows.split(", "):
            assert (REPO / rows).is_file(), f"{path.name} cites {rows}, which is not committed"


def test_profiles_ship_as_package_data():
    text = (REPO / "pyproject.toml").read_text()
    assert '"*" = ["*.json"' in text  # every package's JSON files, the profiles included


def test_the_writer_replaces_one_section_and_keeps_the_others(tmp_path):
    write_profile_section("avx2", "compile", True, "agentserve bench startup", "a.json", tmp_path)
    engine = {"executor": "uni", "allocator": "glibc", "quiet_ray": True}
    write_profile_section(
        "avx2", "engine", engine, "agentserve bench speculative-served", "b.json", tmp_path,
        "2026-11-29",
    )  # fmt: skip
    write_profile_section("avx2", "compile", False, "agentserve bench startup", "c.json", tmp_path)
    got = load_profile(tmp_path / "avx2.json")
    assert got.value("compile") is False and got.compile.source.rows == "c.json"
    assert got.engine.source.date == "2026-11-29" and got.value("engine").executor == "uni"


def test_the_writer_refuses_values_the_profile_does_not_accept(tmp_path):
    with pytest.raises(ValueError):
        write_profile_section("amx", "compile", {"fast": 1}, "c", "r", tmp_path)
    assert not (tmp_path / "amx.json").exists()


def test_a_side_run_outside_a_checkout_leaves_the_profiles_alone(tmp_path):
    assert profile_dir(tmp_path / "docs") is None
    assert profile_dir(REPO / "docs") == profiles.PROFILE_DIR


def _values(directory: Path) -> dict[str, dict]:
    return {
        p.stem: {k: v["values"] for k, v in json.loads(p.read_text()).items() if k != "machine"}
        for p in sorted(directory.glob("*.json"))
    }


def test_the_benches_writers_give_the_shipped_profiles_from_the_committed_rows(tmp_path):
    """Re-deriving every section a bench decides from the rows the profiles cite gives the
    shipped values: the profiles follow their own rows (a new run that changes a choice
    rewrites its profile)."""
    from agentserve_bench import calibrate
    from agentserve_bench.profile_write import write_served_profiles
    from agentserve_bench.served_rows import rows_of_shipped_drafter

    docs, directory = tmp_path / "docs", tmp_path / "platform" / "agentserve" / "profiles"
    directory.mkdir(parents=True)
    (docs / "benchmarks").mkdir(parents=True)
    for name in ("speculative.json", "calibration.json"):
        (docs / "benchmarks" / name).write_text((REPO / "docs" / "benchmarks" / name).read_text())
    served = json.loads((docs / "benchmarks" / "speculative.json").read_text())
    write_served_profiles(rows_of_shipped_drafter(served), None, directory)
    calibrate._write_profiles(
        docs, json.loads((docs / "benchmarks" / "calibration.json").read_text())
    )
    shipped = _values(profiles.PROFILE_DIR)
    for machine, sections in _values(directory).items():
        for name, values in sections.items():
            assert shipped[machine][name] == values, f"{machine}.json {name}: rerun its bench"


def _served(settings: str, method: str, ttft_ms: float, decode: float) -> dict:
    return {
        "path": "served", "server": "agentserve", "settings": settings, "method": method,
        "num_speculative_tokens": 0 if method == "none" else 4, "workload": "coding",
        "concurrency": 1, "ttft_ms_p50": ttft_ms, "decode_tokens_per_s": decode,
        "throughput_tokens_per_s": decode,
        "output_tokens": 64, "requests": 1, "command": "agentserve bench speculative-served",
        "machine": {"cpu_class": "avx2"},
    }  # fmt: skip


def test_a_run_comparing_settings_bundles_writes_the_fastest_as_the_engine_section(tmp_path):
    from agentserve_bench.profile_write import write_engine_profile

    rows = [_served("all-gomp", "none", 300, 20), _served("all-gomp-uni-quiet", "none", 200, 30)]
    assert write_engine_profile("avx2", rows, "agentserve bench x", tmp_path) is not None
    engine = load_profile(tmp_path / "avx2.json").value("engine")
    assert (engine.executor, engine.allocator, engine.quiet_ray) == ("uni", "glibc", True)
    # one bundle measured: nothing compared, nothing written
    assert write_engine_profile("amx", rows[:1], "agentserve bench x", tmp_path) is None
    assert not (tmp_path / "amx.json").exists()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_engine_section_is_a_named_settings_bundle(path):
    """The engine section maps back to the bundle `default_settings` names, so the served
    rows labelled with it are the ones that chose it."""
    from agentserve_bench.profile_write import engine_values
    from agentserve_bench.settings_bundles import SETTINGS, default_settings

    engine = load_profile(path).value("engine")
    if engine is not None:
        name = default_settings(path.stem)
        assert name in SETTINGS and engine_values(name) == engine.model_dump()

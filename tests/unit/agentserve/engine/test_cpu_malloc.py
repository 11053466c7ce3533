"""The allocator a CPU engine preloads (engine/cpu_malloc.py, cpu_settings.engine_environment):
where each library is found, how it joins LD_PRELOAD, and that a process started with that
environment really runs with it."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from agentserve.engine.cpu_malloc import malloc_library
from agentserve.engine.cpu_settings import cpu_malloc, engine_environment
from agentserve_bench.settings_bundles import SETTINGS, default_settings
from profile_fakes import drop_profile, set_profile


def _lib(directory, name):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"")
    return path


def test_each_allocator_is_found_where_it_is_installed(tmp_path):
    system = tmp_path / "usr-lib"
    assert malloc_library("glibc", str(tmp_path), [str(system)]) is None
    assert malloc_library("tcmalloc", str(tmp_path), [str(system)]) is None
    tcmalloc = _lib(system, "libtcmalloc_minimal.so.4")
    assert malloc_library("tcmalloc", str(tmp_path), [str(system)]) == tcmalloc
    # the environment's own lib directory comes before the system's
    own = _lib(tmp_path / "lib", "libtcmalloc.so.4")
    assert malloc_library("tcmalloc", str(tmp_path), [str(system)]) == own
    with pytest.raises(ValueError, match="glibc, tcmalloc, jemalloc"):
        malloc_library("mimalloc", str(tmp_path), [])


def test_jemalloc_ships_in_rays_wheel(tmp_path):
    found = malloc_library("jemalloc", str(tmp_path), [])  # no system library dirs at all
    assert found is not None and found.name == "libjemalloc.so"
    assert found.parent.name == "core" and found.parent.parent.name == "ray"


def test_the_allocator_goes_first_in_ld_preload_and_a_users_own_is_kept(tmp_path, caplog):
    tc = _lib(tmp_path, "libtcmalloc_minimal.so.4")
    iomp = _lib(tmp_path, "libiomp5.so")
    env = {"AGENTSERVE_CPU_MALLOC": "tcmalloc", "AGENTSERVE_CPU_IOMP": "1"}
    assert engine_environment(env, [0, 1], iomp, tc)["LD_PRELOAD"] == f"{tc}:{iomp}"
    user = env | {"LD_PRELOAD": "/x.so"}
    assert engine_environment(user, [0, 1], iomp, tc)["LD_PRELOAD"] == f"{tc}:/x.so:{iomp}"
    own = {"AGENTSERVE_CPU_MALLOC": "tcmalloc", "LD_PRELOAD": "/opt/libjemalloc.so.2"}
    assert "LD_PRELOAD" not in engine_environment(own, [0, 1], None, tc)
    glibc = {"AGENTSERVE_CPU_MALLOC": "glibc"}
    assert "LD_PRELOAD" not in engine_environment(glibc, [0, 1], None, tc)
    # asked for but not installed: glibc's malloc, and a warning that says how to get it
    with caplog.at_level(logging.WARNING):
        missing = engine_environment({"AGENTSERVE_CPU_MALLOC": "tcmalloc"}, [0, 1], None, None)
    assert "LD_PRELOAD" not in missing
    assert "libtcmalloc-minimal4" in caplog.text


def test_the_choice_is_the_env_then_the_measured_kind_then_glibc(monkeypatch):
    set_profile(monkeypatch, "amx", engine={"executor": "uni", "allocator": "jemalloc",
                                            "quiet_ray": True})  # fmt: skip
    drop_profile(monkeypatch, "avx2")
    assert cpu_malloc({}, "amx") == "jemalloc"
    assert cpu_malloc({}, "avx2") == "glibc"
    assert cpu_malloc({"AGENTSERVE_CPU_MALLOC": " TCMalloc "}, "amx") == "tcmalloc"
    with pytest.raises(ValueError, match="AGENTSERVE_CPU_MALLOC='mimalloc'"):
        cpu_malloc({"AGENTSERVE_CPU_MALLOC": "mimalloc"}, "amx")
    assert default_settings("amx").endswith("-jemalloc")
    assert default_settings("amx") in SETTINGS


def test_every_settings_bundle_names_its_allocator():
    for name, bundle in SETTINGS.items():
        assert bundle["AGENTSERVE_CPU_MALLOC"] in ("glibc", "tcmalloc", "jemalloc"), name
        if bundle["AGENTSERVE_CPU_MALLOC"] != "glibc":
            assert name.endswith("-" + bundle["AGENTSERVE_CPU_MALLOC"])


def test_a_process_started_with_the_engine_environment_runs_with_the_allocator():
    """The real thing: a fresh Python started with the variables the replica sets before
    its engine spawns has Ray's jemalloc mapped."""
    env = engine_environment({"AGENTSERVE_CPU_MALLOC": "jemalloc"}, [0], iomp=None)
    assert "libjemalloc.so" in env["LD_PRELOAD"]
    maps = subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/maps').read())"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert env["LD_PRELOAD"] in maps

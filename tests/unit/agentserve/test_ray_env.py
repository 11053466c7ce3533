"""agentserve/ray_env.py: the environment a local Ray cluster's processes start with."""

import pytest
from agentserve.ray_env import QUIET, RAY_DEFAULTS, UNREAD, apply_ray_env, ray_env_name
from profile_fakes import drop_profile, set_profile


def test_the_measured_kind_of_cpu_gets_quiet_and_others_keep_rays_defaults(monkeypatch):
    set_profile(monkeypatch, "amx", engine={"executor": "mp", "allocator": "glibc",
                                            "quiet_ray": True})  # fmt: skip
    drop_profile(monkeypatch, "avx2")
    assert ray_env_name({}, "amx") == "quiet"
    assert ray_env_name({}, "avx2") == "ray"  # never measured: Ray's own defaults
    assert ray_env_name({"AGENTSERVE_RAY_ENV": "ray"}, "amx") == "ray"
    assert ray_env_name({"AGENTSERVE_RAY_ENV": "quiet"}, "avx2") == "quiet"
    with pytest.raises(ValueError, match="AGENTSERVE_RAY_ENV='loud'"):
        ray_env_name({"AGENTSERVE_RAY_ENV": "loud"}, "amx")


def test_apply_sets_only_what_the_environment_does_not_set():
    environ = {"AGENTSERVE_RAY_ENV": "quiet", "RAY_worker_niceness": "5"}
    added = apply_ray_env(environ)
    assert environ["RAY_worker_niceness"] == "5"  # the operator's own value wins
    assert "RAY_worker_niceness" not in added
    for key in set(QUIET) - {"RAY_worker_niceness"}:
        assert environ[key] == QUIET[key] == added[key]
    plain = {"AGENTSERVE_RAY_ENV": "ray"}
    assert apply_ray_env(plain) == {**RAY_DEFAULTS, **UNREAD}  # unread on either
    assert (
        apply_ray_env({"RAY_enable_metrics_collection": "1"})
        .keys()
        .isdisjoint({"RAY_enable_metrics_collection"})
    )  # an operator who wants Ray's metrics keeps them
    assert set(QUIET) == set(RAY_DEFAULTS)  # a bundle names every variable either way


def test_quiet_is_what_rays_processes_read():
    """The names are Ray's: its worker niceness (RayConfig, read from RAY_<name>) and two
    Serve constants; a rename in a Ray upgrade would make the settings silently inert."""
    import inspect

    from ray._private import ray_constants
    from ray.serve._private import constants

    assert ray_constants.RAY_WORKER_NICENESS == "RAY_worker_niceness"
    from pathlib import Path

    from ray import _raylet

    core = Path(_raylet.__file__).read_bytes()  # RayConfig reads RAY_<name> in C++
    for name in UNREAD:
        assert name.encode() + b"\0" in core, name
    source = inspect.getsource(constants)
    for name in ("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"):
        assert f'"{name}"' in source

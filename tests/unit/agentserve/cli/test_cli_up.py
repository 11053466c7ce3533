"""`agentserve up` decisions without Ray: spec + flags, drafter defaults, port check, input
errors (exit 2 before anything starts), readiness and progress text, the ready snippets."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest
from agentserve.cli import build_parser
from agentserve.cli.console import Console
from agentserve.cli.up import (
    PortInUseError,
    check_drafters,
    check_port_free,
    examples,
    run_up,
    with_overrides,
    with_speculation,
)
from agentserve.serve.local import describe_progress, ray_num_cpus, readiness
from agentserve.spec import DeploymentSpec, SpecError, spec_from_dict
from agentserve.spec.defaults import with_default_drafters

SHIPPED = Path("/drafters/smollm2-dflash")


def _found(_: str) -> Path:
    return SHIPPED


def _missing(_: str) -> None:
    return None


def _ngram(_: str) -> str:
    return "ngram"


@pytest.mark.parametrize(
    ("model", "flag", "shipped", "enabled", "noted"),
    [
        ({}, None, _found, True, False),  # default: the shipped drafter
        ({}, None, _missing, False, True),  # none installed: serve plainly, say so
        ({"drafter": {"enabled": False}}, None, _found, False, False),  # the spec says off
        ({"drafter": {"num_speculative_tokens": 3}}, None, _found, True, False),
        ({}, False, _found, False, False),  # --no-drafter
        ({"drafter": {"enabled": False}}, True, _missing, True, False),  # --drafter forces
        ({"engine": "fake"}, None, _found, False, False),  # tests' fake engine: untouched
    ],
)
def test_drafter_defaults_table(model, flag, shipped, enabled, noted):
    spec = spec_from_dict({"models": [model]})
    out, notes = with_default_drafters(spec, flag, shipped)
    assert out.models[0].drafter.enabled is enabled
    assert bool(notes) is noted


@pytest.mark.parametrize(
    ("model", "default", "enabled", "method", "noted"),
    [
        ({}, _ngram, True, "ngram", True),  # measured fastest: n-gram, and `up` says why
        ({}, lambda _: None, False, "dflash", True),  # plain measured fastest: `up` says why
        ({"drafter": {"method": "dflash"}}, _ngram, True, "dflash", False),  # spec's method
        ({"drafter": {"enabled": True}}, _ngram, True, "dflash", False),  # spec decided
        ({"source": "/m"}, _ngram, False, "dflash", False),  # not the bundled model
    ],
)
def test_measured_default_method(model, default, enabled, method, noted):
    spec = spec_from_dict({"models": [model]})
    out, notes = with_default_drafters(spec, None, _found, default)
    drafter = out.models[0].drafter
    assert (drafter.enabled, drafter.method, bool(notes)) == (enabled, method, noted)
    if noted and enabled:
        assert "--speculation dflash" in notes[0]
    elif noted:
        assert "no speculative decoding" in notes[0]


def _drafter_dir(root: Path, block_size: int) -> Path:
    import json

    from agentserve.drafters import BUNDLED_DRAFTER_DIR

    config = json.loads((BUNDLED_DRAFTER_DIR / "config.json").read_text())
    config["block_size"] = block_size
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(
    ("drafter", "block", "want_k"),
    [
        ({"enabled": True}, 5, 4),  # --speculation dflash, a block-5 drafter: k 4, not 7
        ({"enabled": True, "method": "hybrid"}, 5, 4),
        ({"enabled": True}, 8, 7),  # the spec's default fits the block
        ({"enabled": True, "num_speculative_tokens": 6}, 5, 6),  # set: kept (refused later)
        ({"enabled": True, "method": "ngram"}, 5, 7),  # no drafter block to fit
    ],
)
def test_an_unset_k_fits_the_drafters_block(tmp_path, drafter, block, want_k):
    shipped = _drafter_dir(tmp_path / "d", block)
    spec = spec_from_dict({"models": [{"drafter": drafter}]})
    out, _ = with_default_drafters(spec, None, lambda _: shipped)
    assert out.models[0].drafter.num_speculative_tokens == want_k
    if drafter.get("method") == "ngram":
        return  # takes no drafter path
    by_path = spec_from_dict({"models": [{"drafter": {**drafter, "path": str(shipped)}}]})
    out, _ = with_default_drafters(by_path, None, _missing)
    assert out.models[0].drafter.num_speculative_tokens == want_k


@pytest.mark.parametrize(
    ("model", "method", "enabled", "want_method", "want_path"),
    [
        ({}, "ngram", True, "ngram", None),  # the default model: n-gram instead of DFlash
        ({"drafter": {"path": "/d", "enabled": True}}, "ngram", True, "ngram", None),
        ({"drafter": {"path": "/d"}}, "eagle3", True, "eagle3", "/d"),
        ({"drafter": {"enabled": True, "path": "/d"}}, "none", False, "dflash", "/d"),
        ({"drafter": {"num_speculative_tokens": 3}}, None, None, "dflash", None),  # untouched
    ],
)
def test_speculation_flag_table(model, method, enabled, want_method, want_path):
    spec = with_speculation(spec_from_dict({"models": [{"source": "/m", **model}]}), method)
    drafter = spec.models[0].drafter
    assert drafter.method == want_method and drafter.path == want_path
    # an explicit choice is not overridden by the shipped-drafter default
    assert ("enabled" in drafter.model_fields_set) is (enabled is not None)
    if enabled is not None:
        assert drafter.enabled is enabled


def test_up_with_ngram_needs_no_drafter_and_says_what_it_runs():
    spec, _ = with_default_drafters(with_speculation(DeploymentSpec(), "ngram"), None, _missing)
    assert check_drafters(spec) == {"smollm2-135m-instruct": "ngram"}
    args = build_parser().parse_args(["up", "--speculation", "ngram"])
    assert args.speculation == "ngram"


def test_overrides_replace_host_port_and_revalidate():
    spec = with_overrides(DeploymentSpec(), None, 9001)
    assert (spec.server.host, spec.server.port) == ("127.0.0.1", 9001)
    assert with_overrides(spec, None, None) is spec
    with pytest.raises(SpecError) as err:
        with_overrides(DeploymentSpec(), "0.0.0.0", None)
    assert err.value.errors[0][0] == "server.host"


def test_port_check_sees_a_listener():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"127.0.0.1:{port}"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # released: free again


def _up(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    args = build_parser().parse_args(["up", *argv])
    code = run_up(args, Console(io.StringIO(), err, plain=True, environ={}))
    return code, err.getvalue()


def test_bad_spec_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - engine: fake\n    max_model_len: 1\n")
    code, err = _up(["--spec", str(bad)])
    assert code == 2 and "models[0].max_model_len" in err


def test_missing_drafter_exits_2(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"models:\n  - drafter: {{enabled: true, path: {tmp_path / 'none'}}}\n")
    code, err = _up(["--spec", str(spec)])
    assert code == 2 and "drafter directory" in err


def test_port_in_use_exits_2(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models:\n  - engine: fake\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        code, err = _up(["--spec", str(spec), "--port", str(listener.getsockname()[1])])
    assert code == 2 and "--port" in err


def _app(status: str, **deployments: tuple[str, dict, str]) -> dict:
    return {
        "status": status,
        "message": "",
        "deployments": {
            n: {"status": s, "replicas": r, "message": m} for n, (s, r, m) in deployments.items()
        },
    }


@pytest.mark.parametrize(
    ("app", "phase"),
    [
        (None, "starting"),
        (_app("DEPLOYING", ingress=("UPDATING", {"STARTING": 1}, "")), "starting"),
        (_app("RUNNING", ingress=("HEALTHY", {"RUNNING": 1}, "")), "ready"),
        (_app("DEPLOY_FAILED", **{"model-m": ("DEPLOY_FAILED", {}, "boom")}), "failed"),
    ],
)
def test_readiness_table(app, phase):
    assert readiness(app).phase == phase


def test_failure_detail_and_progress_name_the_model():
    failed = _app("DEPLOY_FAILED", **{"model-m": ("DEPLOY_FAILED", {}, "engine crashed")})
    assert readiness(failed).detail == "model-m: engine crashed"
    starting = _app(
        "DEPLOYING",
        ingress=("HEALTHY", {"RUNNING": 1}, ""),
        **{"model-m": ("UPDATING", {"STARTING": 1}, "")},
    )
    assert describe_progress(starting, {"model-m": "m"}) == "model m: replicas 1 STARTING"


def test_local_ray_gets_at_least_the_cpus_replicas_ask_for():
    spec = spec_from_dict({"models": [{"replicas": {"num_cpus": 3}}]})
    assert ray_num_cpus(spec, cpu_count=2) == 3
    assert ray_num_cpus(DeploymentSpec(), cpu_count=16) == 16


@pytest.mark.parametrize("needs_key", [False, True])
def test_examples_are_runnable_snippets(needs_key):
    snippets = examples("http://127.0.0.1:8000", "m", needs_key)
    assert snippets["curl"].startswith("curl http://127.0.0.1:8000/v1/chat/completions")
    assert ('"model": "m"' in snippets["curl"]) and ("Bearer" in snippets["curl"]) is needs_key
    compile(snippets["python"], "example", "exec")
    assert 'base_url="http://127.0.0.1:8000/v1"' in snippets["python"]


@pytest.mark.parametrize(
    ("model", "k"),
    [
        ({}, 4),  # the default method drafts the measured k
        ({"drafter": {"num_speculative_tokens": 6}}, 6),  # the spec's k wins
        ({"drafter": {"method": "ngram"}}, 7),  # the spec chose the method: its own k (default 7)
    ],
)
def test_default_method_drafts_the_measured_tokens(model, k):
    spec = spec_from_dict({"models": [model]})
    out, _ = with_default_drafters(spec, None, _found, _ngram, lambda _: "", lambda _: 4)
    assert out.models[0].drafter.num_speculative_tokens == k


def test_up_with_hybrid_names_hybrid_and_its_drafter_not_vllms_dflash():
    from agentserve.drafters import shipped_drafter

    drafter = shipped_drafter("smollm2-135m-instruct")
    spec, _ = with_default_drafters(
        with_speculation(DeploymentSpec(), "hybrid"), None, lambda _: drafter
    )
    # vLLM runs "dflash" for it (engine/vllm_args.py); the banner says what the user chose
    assert check_drafters(spec) == {"smollm2-135m-instruct": f"hybrid {drafter}"}

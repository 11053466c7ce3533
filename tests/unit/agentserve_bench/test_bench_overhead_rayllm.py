"""`agentserve bench overhead`'s ray_serve_llm system without Ray or vLLM: the app config
carries vllm_serve's engine arguments, the overlay check, and the records it leaves."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentserve.cli import build_parser
from agentserve.spec import ModelSpec
from agentserve_bench import overhead, rayllm_env
from agentserve_bench.fake_engine import FakeEngine
from agentserve_bench.overhead_peers import peer_engine_args, serve_args
from agentserve_bench.overhead_phases import _run_levels
from agentserve_bench.overhead_rayllm import builder_config
from agentserve_bench.overhead_requests import engine_request_fn

SECTION = "platform-overhead-no-drafter"
DOC = f"# Benchmarks\n\n<!-- {SECTION}:begin -->\nold\n<!-- {SECTION}:end -->\n"


def _model(**extra):
    data = {"name": "m", "max_model_len": 1024, "max_num_seqs": 16, "dtype": "float16"}
    return ModelSpec.model_validate({**data, **extra})


@pytest.mark.parametrize(
    "drafter",
    [None, {"enabled": True, "method": "ngram", "num_speculative_tokens": 3}],
)
def test_the_llm_config_carries_the_engine_arguments_vllm_serve_gets(drafter):
    model = _model(**({"drafter": drafter} if drafter else {}))
    (llm,) = builder_config(model, "/models/m", cpu=True)["llm_configs"]
    engine = llm["engine_kwargs"]
    assert engine == peer_engine_args(model, "/models/m")
    assert (engine["dtype"], engine["max_model_len"], engine["max_num_seqs"]) == (
        "float16",
        1024,
        16,
    )
    # Ray Serve LLM refuses these in engine_kwargs: they come from model_loading_config
    assert not {"model", "served_model_name"} & set(engine)
    assert llm["model_loading_config"] == {"model_id": "m", "model_source": "/models/m"}
    assert llm["deployment_config"] == {"num_replicas": 1}
    assert llm["accelerator_config"] == {"kind": "cpu"}
    # every engine argument is one vllm_serve passes as a flag, or a store_true flag left
    # at its False default (vLLM's CLI has no --no- form for disable_*)
    flags = serve_args(model, "/models/m", 8000)
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if flag in flags:
            at = flags.index(flag)
            assert value is True or flags[at + 1] in (str(value), json.dumps(value))
        else:
            assert value is False and key.startswith("disable_"), key
    assert ("speculative_config" in engine) is (drafter is not None)
    if drafter:
        assert engine["speculative_config"]["num_speculative_tokens"] == 3


def test_on_a_gpu_ray_keeps_its_default_accelerator_and_the_batching_knob_is_optional():
    model = _model()
    (llm,) = builder_config(model, "/m", cpu=False)["llm_configs"]
    assert "accelerator_config" not in llm and "experimental_configs" not in llm
    (llm,) = builder_config(model, "/m", cpu=True, stream_batching_interval_ms=0)["llm_configs"]
    assert llm["experimental_configs"] == {"stream_batching_interval_ms": 0}


def test_overlay_requirements_are_found_in_the_overlay_or_reported_missing(tmp_path):
    dist = tmp_path / "fakepkg_for_overlay-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fakepkg_for_overlay\nVersion: 1.0\n"
    )
    wanted = ("fakepkg-for-overlay==1.0", "pytest==0", "surely-absent-pkg==2.0")
    assert rayllm_env.missing(tmp_path, wanted) == ["surely-absent-pkg==2.0"]
    assert rayllm_env.missing(tmp_path / "empty", wanted) == [
        "fakepkg-for-overlay==1.0",
        "surely-absent-pkg==2.0",
    ]
    command = rayllm_env.install_command(tmp_path, python="py")
    assert command[:6] == ["py", "-m", "pip", "install", "--no-deps", "--target"]
    assert command[6] == str(tmp_path) and "pandas==3.1.1" in command
    assert not any(r.startswith(("vllm", "nixl", "torch")) for r in rayllm_env.REQUIREMENTS)


def test_problem_names_what_is_missing_and_how_to_install(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setattr(rayllm_env, "REQUIREMENTS", ("surely-absent-pkg==2.0",))
    monkeypatch.setattr(rayllm_env.metadata, "version", lambda name: "1.0")
    reason = rayllm_env.problem(tmp_path)
    assert "surely-absent-pkg" in reason and "rayllm_env --install" in reason
    monkeypatch.setattr(rayllm_env, "REQUIREMENTS", ("pytest==0",))
    assert rayllm_env.problem(tmp_path) is None
    monkeypatch.setenv(rayllm_env.OVERLAY_ENV, str(tmp_path / "o"))
    assert rayllm_env.overlay_dir() == tmp_path / "o"


def _fake_levels(model, plan, system):
    async def go():
        engine = FakeEngine(model, token_delay_s=0.002)
        await engine.start()
        try:
            return await _run_levels(
                engine_request_fn(engine, model.name, plan.max_tokens), plan, system
            )
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_the_records_carry_ray_serve_llm_and_what_it_ran_with(tmp_path, monkeypatch, capsys):
    (tmp_path / "benchmarks.md").write_text(DOC)
    monkeypatch.setattr(overhead, "resolve_model", lambda source, progress=False: tmp_path)
    started = []

    def rayllm_runner(model, model_dir, plan, timeout_s, log_dir):
        started.append((model.max_num_seqs, model_dir, model.drafter.enabled))
        return _fake_levels(model, plan, "ray_serve_llm"), {"stream_batching_interval_ms": 50.0}

    def platform_runner(spec, factory, plan, timeout_s):
        return _fake_levels(spec.models[0], plan, "agentserve")

    argv = ["bench", "overhead", "--no-drafter", "--concurrency", "1,2", "--max-tokens", "4"]
    argv += ["--systems", "ray_serve_llm,agentserve", "--docs", str(tmp_path)]
    code = overhead.run(
        build_parser().parse_args(argv),
        platform_runner=platform_runner,
        rayllm_runner=rayllm_runner,
        rayllm_check=lambda: None,
    )
    assert code == 0 and started == [(16, str(tmp_path), False)]  # max(16, 1, 2)
    report = json.loads((tmp_path / "benchmarks" / "platform_overhead_no_drafter.json").read_text())
    assert list(report["systems"]) == ["ray_serve_llm", "agentserve"]
    assert report["reference"] == "ray_serve_llm" and report["skipped"] is None
    assert report["ray_serve_llm"] == {"stream_batching_interval_ms": 50.0}
    for level in report["levels"]:
        assert set(level["systems"]) == {"ray_serve_llm", "agentserve"}
        assert level["systems"]["ray_serve_llm"]["output_tokens"] == 4 * 8
    assert "stream batching 50.0 ms" in (tmp_path / "benchmarks.md").read_text()


def test_a_default_run_without_the_overlay_says_why_ray_serve_llm_is_skipped(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "benchmarks.md").write_text(DOC)
    monkeypatch.setattr(overhead, "resolve_model", lambda source, progress=False: tmp_path)
    ran = []
    monkeypatch.setattr(
        overhead, "bare_vllm", lambda m, d, p: ran.append("bare") or _fake_levels(m, p, "bare")
    )

    def peer(model, model_dir, plan, timeout_s, log_dir):
        ran.append("vllm_serve")
        return _fake_levels(model, plan, "vllm_serve")

    def never(*a):
        raise AssertionError("ray_serve_llm must not start")

    argv = ["bench", "overhead", "--no-drafter", "--concurrency", "1", "--max-tokens", "3"]
    overhead.run(
        build_parser().parse_args([*argv, "--docs", str(tmp_path)]),
        platform_runner=lambda spec, f, plan, t: _fake_levels(spec.models[0], plan, "agentserve"),
        peer_runner=peer,
        rayllm_runner=never,
        rayllm_check=lambda: "ray 2.60 needs pyarrow",
    )
    assert ran == ["bare", "vllm_serve"]
    assert "ray_serve_llm skipped: ray 2.60 needs pyarrow" in capsys.readouterr().out
    report = json.loads((tmp_path / "benchmarks" / "platform_overhead_no_drafter.json").read_text())
    assert report["skipped"] == "ray_serve_llm skipped: ray 2.60 needs pyarrow"
    assert "ray_serve_llm skipped" in (tmp_path / "benchmarks.md").read_text()


def test_when_ray_serve_llm_fails_to_start_the_run_goes_on_and_records_why(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "benchmarks.md").write_text(DOC)
    monkeypatch.setattr(overhead, "resolve_model", lambda source, progress=False: tmp_path)

    def broken(model, model_dir, plan, timeout_s, log_dir):
        raise RuntimeError("Ray Serve LLM exited (1):\nloading...\nImportError: no pyarrow")

    argv = ["bench", "overhead", "--no-drafter", "--concurrency", "1", "--max-tokens", "3"]
    argv += ["--systems", "ray_serve_llm,agentserve", "--docs", str(tmp_path)]
    assert (
        overhead.run(
            build_parser().parse_args(argv),
            platform_runner=lambda spec, f, p, t: _fake_levels(spec.models[0], p, "agentserve"),
            rayllm_runner=broken,
            rayllm_check=lambda: None,
        )
        == 0
    )
    why = "ray_serve_llm could not run: Ray Serve LLM exited (1): | loading... | ImportError"
    assert why in capsys.readouterr().out
    report = json.loads((tmp_path / "benchmarks" / "platform_overhead_no_drafter.json").read_text())
    assert list(report["systems"]) == ["agentserve"] and report["skipped"].startswith(why)
    assert "ImportError: no pyarrow" in (tmp_path / "benchmarks.md").read_text()

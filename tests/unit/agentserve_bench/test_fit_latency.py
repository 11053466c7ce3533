"""`agentserve bench fit-latency` measures a served model's step costs through the HTTP API
and fits the latency_model section the SLA policy plans with (spec/latency.py). Here it
measures the ingress app on uvicorn over the fake engine, whose step takes 20 ms plus 10 ms
per running sequence: the fit must recover that, and the section must reach the policy."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import pytest
import yaml
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve.speculation.schedule import latency_model_for, with_default_schedules
from agentserve_bench.fake_engine import FakeEngine
from agentserve_bench.fit_latency import fit_latency, latency_section, measure


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    import uvicorn

    port = _free_port()
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 1024, "max_num_seqs": 8}]}
    )
    engine = FakeEngine(
        "m", 1024, token_delay_s=0.02, per_seq_delay_s=0.01, accept_per_step=1, max_num_seqs=8
    )
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(timeout=10)


def test_the_fit_recovers_the_engines_step_costs(server):
    lines: list[str] = []
    figures = asyncio.run(
        measure(server, "m", concurrencies=(1, 2, 4), max_tokens=24, rounds=1,
                prompt_words=(16, 200), progress=lines.append)
    )  # fmt: skip
    assert [d["concurrency"] for d in figures["decode"]] == [1, 2, 4] and len(lines) == 5
    section = fit_latency(figures)
    spec = DeploymentSpec.model_validate(yaml.safe_load(latency_section("m", section)) | {})
    model = latency_model_for(spec.models[0])
    assert model is not None  # a model the platform has no figures for now has one
    for batch, step_ms in ((1, 30.0), (4, 60.0)):  # 20 ms + 10 ms per running sequence
        assert model.step_ms(batch) == pytest.approx(step_ms, rel=0.3), (batch, section)
    assert 0 <= section["prefill_ms_per_token"] < 0.5  # the fake engine does not prefill


def test_the_command_prints_the_section_and_saves_the_figures(server, tmp_path, capsys):
    from agentserve.autoscale.model import LatencyModel
    from agentserve.cli import main

    out = tmp_path / "fit.json"
    argv = ["bench", "fit-latency", "--url", server, "--model", "m", "--concurrency", "1,2",
            "--max-tokens", "8", "--rounds", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    section = printed["models"][0]["latency_model"]
    assert printed["models"][0]["name"] == "m" and section["base_ms"] > 0
    assert LatencyModel.load(out).base_ms == section["base_ms"]  # --latency-model takes it


def test_a_models_own_latency_model_reaches_the_policy_and_its_absence_is_logged(caplog):
    from agentserve.serve.app import deployment_options

    replicas = {"min_replicas": 1, "max_replicas": 4, "num_gpus": 1}
    own = {"base_ms": 12.0, "per_token_ms": 0.05, "knee_tokens": 16, "prefill_ms_per_token": 0.1}
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "big", "source": "org/big-model", "replicas": replicas,
                     "latency_model": own}]}
    )  # fmt: skip
    kwargs = deployment_options(spec.models[0], spec)["autoscaling_config"]["policy"]
    planned = kwargs["policy_kwargs"]["model"]
    assert (planned["base_ms"], planned["prefill_ms_per_token"]) == (12.0, 0.1)
    bare = spec.model_copy(update={"models": [spec.models[0].model_copy(
        update={"latency_model": None})]})  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="agentserve.serve.app"):
        options = deployment_options(bare.models[0], bare)
    assert options["autoscaling_config"]["policy"]["policy_kwargs"]["model"] is None
    assert "no latency model" in caplog.text and "fit-latency" in caplog.text


def test_a_schedule_comes_from_a_models_own_latency_model_only_with_its_acceptance():
    drafter = {"enabled": True, "method": "ngram", "num_speculative_tokens": 4}
    base = {"name": "big", "source": "org/big-model", "replicas": {"num_gpus": 1},
            "drafter": drafter}  # fmt: skip
    own = {"base_ms": 12.0, "per_token_ms": 0.5, "knee_tokens": 8, "prefill_ms_per_token": 0.1}
    guessed = DeploymentSpec.model_validate({"models": [base | {"latency_model": own}]})
    assert with_default_schedules(guessed) is guessed  # acceptance unknown: fixed k
    measured = own | {"alpha_1": 0.6, "alpha_drop_per_doubling": 0.05}
    spec = DeploymentSpec.model_validate({"models": [base | {"latency_model": measured}]})
    drafter = with_default_schedules(spec).models[0].drafter
    assert drafter.num_speculative_tokens_per_batch_size
    assert latency_model_for(spec.models[0]).alpha_1 == 0.6

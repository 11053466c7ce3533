"""Fitting the latency model from `agentserve bench speculative` records."""

from __future__ import annotations

import json

import pytest
from agentserve.autoscale.model import LatencyModel, Measurement
from agentserve_bench.autoscale.fit_bench import fit_bench_records, main, measurements_from_bench


def _cell(method, k, batch, tokens_per_s, tau=1.0, engine="vllm", temperature=0.0):
    return {
        "engine": engine,
        "method": method,
        "num_speculative_tokens": k,
        "batch_size": batch,
        "temperature": temperature,
        "tokens_per_s": tokens_per_s,
        "tau": tau,
    }


def _records(truth: LatencyModel) -> list[dict]:
    """Cells a perfect engine following `truth` would produce."""
    cells = []
    for batch in (1, 2, 4, 8):
        for k in (0, 3, 7):
            tau = truth.tau(batch, k)
            step = truth.step_ms(batch, k)
            cells.append(_cell("dflash" if k else "none", k, batch, 1000 * batch * tau / step, tau))
    cells.append(_cell("ngram", 7, 1, 99.0))  # skipped
    cells.append(_cell("dflash", 7, 1, 99.0, engine="reference"))  # skipped
    cells.append(_cell("dflash", 7, 1, 99.0, temperature=1.0))  # other temperature
    return cells


def test_step_time_follows_from_throughput_and_tau():
    got = measurements_from_bench([_cell("none", 0, 4, 132.0), _cell("dflash", 7, 1, 95.0, 4.0)])
    assert got == [Measurement(4, 0, 30.303, 1.0), Measurement(1, 7, 42.105, 4.0)]


def test_fit_recovers_the_model_behind_the_cells():
    truth = LatencyModel(
        base_ms=30.0, knee_tokens=4.0, per_token_ms=2.0, alpha_1=0.75, alpha_drop_per_doubling=0.08
    )
    model = fit_bench_records(_records(truth), prefill_ms_per_token=0.5)
    assert model.base_ms == pytest.approx(30.0, abs=0.1)
    assert model.per_token_ms == pytest.approx(2.0, abs=0.01)
    assert model.alpha_1 == pytest.approx(0.75, abs=0.01)
    assert model.alpha_drop_per_doubling == pytest.approx(0.08, abs=0.01)
    assert model.prefill_ms_per_token == 0.5


def test_cli_writes_a_loadable_model(tmp_path):
    src, out = tmp_path / "speculative.json", tmp_path / "model.json"
    src.write_text(json.dumps(_records(LatencyModel())))
    assert main([str(src), "--out", str(out)]) == 0
    assert LatencyModel.load(out).alpha_1 == pytest.approx(0.7, abs=0.01)

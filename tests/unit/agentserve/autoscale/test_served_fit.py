"""The capacity model from the step costs measured through the server on a kind of CPU
(served_fit.py): held to the committed `agentserve bench fit-latency` figures, used ahead of
a model derived from GEMM step costs, and closer to the served steps than what the policy
planned with before on that kind."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from agentserve import profiles
from agentserve.autoscale import calibrated_model
from agentserve.autoscale.calibrated_model import latency_model_from_profile
from agentserve.autoscale.model import LatencyModel, drafted_for
from agentserve.autoscale.served_fit import TERMS, served_latency_model
from agentserve.drafters import default_dtype, shipped_drafter
from agentserve.engine.cpu_info import CpuInfo
from agentserve.engine.step_costs import profile_cache_path
from agentserve.sources.models import BUNDLED_MODEL
from agentserve.spec import DeploymentSpec
from agentserve.speculation.choice import drafter_fraction
from agentserve.speculation.schedule import (
    latency_model_for,
    method_acceptance,
    method_draft_rate,
)
from agentserve_bench.fit_latency import read_served_fits

BENCH = Path(__file__).resolve().parents[4] / "docs" / "benchmarks"
AVX2 = CpuInfo("Test CPU", 2, ("avx2",))


def _model(method: str = "ngram", dtype: str = "float32"):
    drafter = {"enabled": True, "method": method}
    return DeploymentSpec.model_validate({"models": [{"drafter": drafter, "dtype": dtype}]}).models[
        0
    ]


def _figures(kind: str) -> dict:
    return json.loads((BENCH / f"fit_latency_{kind}.json").read_text())


def _profiled_fits() -> dict[str, dict[str, tuple]]:
    """{cpu_class: {dtype: terms}} as the shipped profiles hold them."""
    out = {}
    for path in sorted(profiles.PROFILE_DIR.glob("*.json")):
        fits = profiles.load_profile(path).value("served_fit") or {}
        if fits:
            out[path.stem] = {d: tuple(getattr(t, n) for n in TERMS) for d, t in fits.items()}
    return out


def test_the_profiles_fits_are_what_the_committed_figures_give():
    assert read_served_fits(BENCH) == _profiled_fits(), "rerun `agentserve bench fit-latency`"
    assert set(_profiled_fits()) >= {"avx2", "avx512_bf16"}
    for kind, by_dtype in _profiled_fits().items():  # each in the dtype `up` serves in
        assert list(by_dtype) == [default_dtype(BUNDLED_MODEL, kind) or "bfloat16"]


@pytest.mark.parametrize("kind", sorted(_profiled_fits()))
def test_the_plan_on_a_fitted_kind_is_its_served_steps(kind, monkeypatch):
    """The step and prefill the SLA policy plans with on that kind are the measured ones:
    each concurrency's served time per output token within 15%, and closer over all of them
    than the whole-engine fit of another kind of CPU (what a kind without figures gets)."""
    monkeypatch.delenv("AGENTSERVE_CALIBRATE", raising=False)
    figures = _figures(kind)
    dtype = default_dtype(BUNDLED_MODEL, kind) or "bfloat16"
    plan = latency_model_for(_model(dtype=dtype), machine=kind)
    assert plan is not None
    assert plan.prefill_ms_per_token == figures["latency_model"]["prefill_ms_per_token"]
    assert (plan.alpha_1, plan.alpha_drop_per_doubling) == method_acceptance()["ngram"]
    errors, generic = [], []
    for point in figures["figures"]["decode"]:
        served, batch = point["tpot_ms"], point["concurrency"]
        errors.append(abs(plan.step_ms(batch) / served - 1))
        generic.append(abs(LatencyModel().step_ms(batch) / served - 1))
    assert max(errors) <= 0.15, errors
    assert sum(errors) < sum(generic)


def test_a_served_fit_wins_over_this_machines_cached_calibration(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("AGENTSERVE_CALIBRATE", raising=False)
    monkeypatch.setattr(calibrated_model, "_read_cpu_info", lambda: AVX2)
    # the profile `agentserve bench calibrate` measured on an AVX2 EPYC
    profile = json.loads((BENCH / "calibration_avx2_2026-11-29.json").read_text())[0]
    path = profile_cache_path(tmp_path / "models" / BUNDLED_MODEL, AVX2, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(profile))
    model, base = _model(), _ngram(LatencyModel())
    assert latency_model_for(model) == served_latency_model("avx2", "float32", base)
    assert latency_model_for(model) != latency_model_from_profile(profile, "float32", "ngram", base)
    # a dtype the kind was not served in falls back to the calibration
    bf16 = _model(dtype="bfloat16")
    assert latency_model_for(bf16) == latency_model_from_profile(profile, "bfloat16", "ngram", base)
    # and the switch that turns machine-specific step costs off turns this off too
    monkeypatch.setenv("AGENTSERVE_CALIBRATE", "0")
    assert latency_model_for(model) == base


def _ngram(base: LatencyModel) -> LatencyModel:
    alpha_1, drop = method_acceptance()["ngram"]
    rate = method_draft_rate()["ngram"]
    return dataclasses.replace(base, alpha_1=alpha_1, alpha_drop_per_doubling=drop, draft_rate=rate)


def test_a_drafter_running_every_step_adds_its_share_to_every_step(monkeypatch):
    monkeypatch.delenv("AGENTSERVE_CALIBRATE", raising=False)
    ngram = latency_model_for(_model("ngram"), machine="avx2")
    dflash = latency_model_for(_model("dflash"), machine="avx2")
    assert ngram.speculative_step_factor == 1.0 and not ngram.drafter_every_step
    share = drafter_fraction(shipped_drafter(BUNDLED_MODEL))
    assert share is not None and share > 0
    assert dflash.drafter_every_step
    assert dflash.speculative_step_factor == pytest.approx(1 + share, abs=1e-4)
    assert dflash.step_ms(1) == pytest.approx(ngram.step_ms(1) * (1 + share), rel=1e-3)
    assert served_latency_model("avx", "float32", LatencyModel()) is None  # nothing measured


def test_the_default_deployments_projected_tpot_is_what_the_server_measured(monkeypatch):
    """The TPOT the SLA policy projects for `agentserve up`'s default on avx2 (n-gram, the
    schedule the rows record) against the served default's time per output token, averaged
    over the two workloads: within 15% at each concurrency. It needs the served step costs,
    n-gram's acceptance and its draft rate together: each alone was 25% to 2x short."""
    monkeypatch.delenv("AGENTSERVE_CALIBRATE", raising=False)
    rows = json.loads((BENCH / "speculative_served_avx2_served_fit.json").read_text())
    ngram = [r for r in rows if r["method"] == "ngram"]
    plan = latency_model_for(_model("ngram"), machine="avx2")
    every_step = dataclasses.replace(plan, draft_rate=1.0)
    for c in sorted({r["concurrency"] for r in ngram}):
        level = [r for r in ngram if r["concurrency"] == c]
        served = sum(1000 / r["decode_tokens_per_s"] for r in level) / len(level)
        k = drafted_for([tuple(x) for x in level[0]["schedule"]], c)
        assert k > 0
        assert plan.tpot_ms(c, k) == pytest.approx(served, rel=0.15), (c, k)
        if c == 1:  # one stream: half its steps found no match; taking all as drafting
            assert every_step.tpot_ms(c, k) < 0.9 * served  # ... projected it 13% short

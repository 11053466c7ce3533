"""The capacity model and the speculation schedule from a machine's calibrated step costs
(issue 32 item 3): derived from the profiles `agentserve bench calibrate` recorded
(docs/benchmarks/calibration.json), used where the replicas' machine has one, and the
whole-engine fit (LatencyModel()) everywhere else."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from agentserve import profiles
from agentserve.autoscale import calibrated_model
from agentserve.autoscale.calibrated_model import (
    latency_model_from_profile,
    measured_step_factor,
    step_terms,
)
from agentserve.autoscale.model import WHOLE_ENGINE_MACHINE, LatencyModel, drafted_for
from agentserve.autoscale.policy_types import PolicySpec
from agentserve.autoscale.ray_policy import policy_spec_from_json
from agentserve.engine.cpu_info import CpuInfo
from agentserve.engine.step_costs import profile_cache_path
from agentserve.sources.models import BUNDLED_MODEL
from agentserve.spec import DeploymentSpec
from agentserve.speculation.choice import measured_served_factors
from agentserve.speculation.schedule import (
    latency_model_for,
    method_acceptance,
    method_draft_rate,
    schedule_for,
    with_default_schedules,
)
from agentserve_bench.served_fits import served_step_factor
from agentserve_bench.served_rows import rows_of_shipped_drafter
from profile_fakes import set_profile

try:  # the deployment options Ray Serve gets (ray.serve is already imported by other tests)
    from agentserve.serve.app import deployment_options
except ImportError:  # pragma: no cover - without Ray Serve
    deployment_options = None

BENCH = Path(__file__).resolve().parents[4] / "docs" / "benchmarks"
AVX512 = CpuInfo("Test CPU", 2, ("avx2", "avx512f"))  # a kind with no whole-engine fit


def _profiles() -> list[dict]:
    return json.loads((BENCH / "calibration.json").read_text())


def _ngram_base() -> LatencyModel:
    alpha_1, drop = method_acceptance()["ngram"]
    return dataclasses.replace(
        LatencyModel(),
        alpha_1=alpha_1,
        alpha_drop_per_doubling=drop,
        draft_rate=method_draft_rate()["ngram"],
    )


SERVED_STEP_FACTOR = measured_step_factor()
SERVED_FACTOR = measured_served_factors()[0]


def _recorded_step_terms() -> dict[str, dict[str, tuple]]:
    """{cpu_class: {dtype: (base_ms, knee_tokens, per_token_ms)}} the profiles hold."""
    out = {}
    for path in sorted(profiles.PROFILE_DIR.glob("*.json")):
        terms = profiles.load_profile(path).value("step_terms") or {}
        if terms:
            out[path.stem] = {
                d: (t.base_ms, t.knee_tokens, t.per_token_ms) for d, t in terms.items()
            }
    return out


def _spec(**model) -> DeploymentSpec:
    drafter = {"enabled": True, "method": "ngram"}
    return DeploymentSpec.model_validate({"models": [{"drafter": drafter, **model}]})


def _point(profile: dict, dtype: str, batch: int, tokens: int) -> float:
    return float(profile["dtypes"][dtype]["step_ms"][str(batch)][str(tokens)])


def test_recorded_terms_and_step_factor_are_what_the_figures_give():
    profiles = _profiles()
    recorded = {
        p["machine"]["cpu_class"]: {d: step_terms(p, d) for d in p["dtypes"]} for p in profiles
    }
    assert recorded == _recorded_step_terms(), "rerun `agentserve bench calibrate --report-only`"
    rows = rows_of_shipped_drafter(json.loads((BENCH / "speculative.json").read_text()))
    assert served_step_factor(profiles, rows) == SERVED_STEP_FACTOR
    assert SERVED_STEP_FACTOR >= 1.0  # a whole step is never cheaper than its GEMMs


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_derivation_follows_the_recorded_profile(dtype):
    # every step drafting (draft rate 1): the costs of a drafting step are under test here
    base = dataclasses.replace(_ngram_base(), draft_rate=1.0)
    for profile in _profiles():
        model = latency_model_from_profile(profile, dtype, "ngram", base)
        base_ms, knee, per_token = step_terms(profile, dtype)
        assert (model.base_ms, model.knee_tokens) == (round(base_ms * SERVED_STEP_FACTOR, 3), knee)
        assert model.per_token_ms == round(per_token * SERVED_STEP_FACTOR, 4)
        # every measured point, times the served step factor, is on the fitted roofline
        # within the profile's timing noise (a least-squares fit over its 12 points)
        roofline = latency_model_from_profile(profile, dtype, None, base)
        assert roofline.speculative_step_factor == 1.0  # plain decoding: no correction
        for batch, by_tokens in profile["dtypes"][dtype]["step_ms"].items():
            for tokens, ms in by_tokens.items():
                fitted = roofline.step_ms(int(batch), int(tokens) - 1)
                assert fitted == pytest.approx(SERVED_STEP_FACTOR * ms, rel=0.25)
        # a speculative step carries the speculation choice's served correction
        assert model.speculative_step_factor == pytest.approx(1 / SERVED_FACTOR["ngram"], 1e-3)
        for k in (1, 4, 7):
            assert model.step_ms(1, k) == pytest.approx(
                roofline.step_ms(1, k) / SERVED_FACTOR["ngram"], rel=1e-3
            )
        assert model.step_ms(4, 0) == roofline.step_ms(4, 0)
        # prefill and acceptance are not in the profile: kept from the base model
        assert model.prefill_ms_per_token == LatencyModel().prefill_ms_per_token
        assert (model.alpha_1, model.alpha_drop_per_doubling) == method_acceptance()["ngram"]


def test_cheaper_verification_drafts_more_at_batch_1():
    cheap = _profiles()[0]  # AMX bf16: verifying 8 tokens costs about what 1 does
    dear = copy.deepcopy(cheap)  # every verified row costs a whole decode step (no bf16 units)
    one = _point(cheap, "bfloat16", 1, 1)
    for batch, by_tokens in dear["dtypes"]["bfloat16"]["step_ms"].items():
        for tokens in by_tokens:
            by_tokens[tokens] = one * int(batch) * int(tokens)
    model = _spec().models[0]
    k = {
        name: drafted_for(
            schedule_for(model, latency_model_from_profile(p, "bfloat16", "ngram", _ngram_base())),
            1,
        )
        for name, p in (("cheap", cheap), ("dear", dear))
    }
    assert k["cheap"] > k["dear"]
    assert k["cheap"] == model.drafter.num_speculative_tokens and k["dear"] == 0


@pytest.fixture
def this_machine(monkeypatch, tmp_path):
    """An AVX-512 machine (no whole-engine fit) with an empty agentserve cache."""
    monkeypatch.setenv("AGENTSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("AGENTSERVE_CALIBRATE", raising=False)
    monkeypatch.setattr(calibrated_model, "_read_cpu_info", lambda: AVX512)
    return tmp_path


def _cache(root: Path, profile: dict) -> None:
    path = profile_cache_path(root / "models" / BUNDLED_MODEL, AVX512, root)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(profile))


def test_without_a_profile_the_fitted_model_is_used(this_machine):
    model = _spec().models[0]
    assert latency_model_for(model) == _ngram_base()
    assert latency_model_for(model, machine="avx2") == _ngram_base()  # nothing recorded
    assert latency_model_for(model, machine="cuda") == _ngram_base()  # CPU replicas
    assert latency_model_for(_spec(replicas={"num_gpus": 1}).models[0]) is None  # no GPU one


def test_where_the_whole_engine_fit_holds_it_wins_over_the_profile(this_machine):
    model = _spec().models[0]
    assert latency_model_for(model, machine=WHOLE_ENGINE_MACHINE) == _ngram_base()


def test_a_cached_calibration_feeds_the_schedule_and_the_policy(this_machine, monkeypatch):
    profile = copy.deepcopy(_profiles()[0])
    profile["machine"] = AVX512.as_dict()
    _cache(this_machine, profile)
    spec = _spec(replicas={"min_replicas": 1, "max_replicas": 4})
    model = spec.models[0]
    calibrated = latency_model_for(model)
    assert calibrated == latency_model_from_profile(profile, "bfloat16", "ngram", _ngram_base())
    assert calibrated != _ngram_base()
    # the speculation schedule (speculation_schedule: auto) comes from it ...
    scheduled = with_default_schedules(spec)
    got = scheduled.models[0].drafter.num_speculative_tokens_per_batch_size
    assert got == schedule_for(model, calibrated) != schedule_for(model, _ngram_base())
    # ... and the policy's capacity model is it (as serve/app.py deployment_options builds it)
    policy = PolicySpec.from_deployment(scheduled, latency_model=latency_model_for(model))
    assert policy.model == calibrated
    assert policy.schedule == tuple(tuple(r) for r in got)
    if deployment_options is not None:  # the options `agentserve up` gives Ray Serve
        raw = deployment_options(model, spec)["autoscaling_config"]
        assert policy_spec_from_json(raw["policy"]["policy_kwargs"]).model == calibrated
    # the switch that turns calibration off turns this off too
    monkeypatch.setenv("AGENTSERVE_CALIBRATE", "0")
    assert latency_model_for(model) == _ngram_base()


def test_a_recorded_profile_serves_a_kind_named_by_the_operator(monkeypatch, this_machine):
    terms = _recorded_step_terms()["amx"]
    set_profile(monkeypatch, "avx512", step_terms=profiles.section("amx", "step_terms"))
    model = _spec(dtype="float32").models[0]
    got = latency_model_for(model, machine="avx512")
    assert got is not None and got.base_ms == round(terms["float32"][0] * SERVED_STEP_FACTOR, 3)
    assert latency_model_for(model, machine="avx") == _ngram_base()  # nothing measured there

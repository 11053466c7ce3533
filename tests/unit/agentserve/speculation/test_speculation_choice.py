"""The embedded default on an unmeasured CPU: choose() against the step-cost profiles that
`agentserve bench calibrate` recorded (docs/benchmarks/calibration.json), the served factor
against the served figures, and resolve_drafters' use of the calibrated choice."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import agentserve.spec.defaults as spec_defaults
import pytest
from agentserve.drafters import (
    BUNDLED_DRAFTER_DIR,
    default_speculation,
    default_speculation_tokens,
    has_served_speculation,
)
from agentserve.sources.models import BUNDLED_MODEL
from agentserve.spec import DeploymentSpec
from agentserve.speculation.choice import (
    LOADED_BATCH,
    MIN_GAIN,
    Choice,
    choose,
    choose_served,
    drafter_fraction,
    measured_served_factors,
    predicted_speedup,
)
from agentserve.speculation.schedule import method_acceptance
from agentserve_bench.served_fits import factor_rows, served_factors
from agentserve_bench.served_rows import rows_of_shipped_drafter
from agentserve_bench.settings_bundles import SCHEDULE_OFF, default_settings

BENCH = Path(__file__).resolve().parents[4] / "docs" / "benchmarks"
DRAFTING = drafter_fraction(BUNDLED_DRAFTER_DIR) or 0.0
FRACTIONS = {"ngram": 0.0, "dflash": DRAFTING, "hybrid": DRAFTING}  # hybrid drafts every step
SERVED_FACTOR, SERVED_FACTOR_LOADED = measured_served_factors()  # the pooled profile's
MEASURED_ACCEPTANCE = method_acceptance()


def _profiles() -> list[dict]:
    path = BENCH / "calibration.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `agentserve bench calibrate`")
    return json.loads(path.read_text())


def _choose(profile: dict) -> Choice:
    return choose_served(profile, MEASURED_ACCEPTANCE, FRACTIONS)


def _flat_profile(decode_ms: float, verify_ms: float) -> dict:
    """A recorded profile with every decode step `decode_ms` and every verification step
    `verify_ms`, at every batch size."""
    flat = copy.deepcopy(_profiles()[0])
    for costs in flat["dtypes"].values():
        for by_tokens in costs["step_ms"].values():
            for n in by_tokens:
                by_tokens[n] = decode_ms if n == "1" else verify_ms
    return flat


def test_profiles_were_recorded_by_the_benchmark():
    # one per kind of CPU measured (amx so far: an AVX2-only machine's profile is recorded
    # by running the benchmark there; no emulated profile stands in for it)
    profiles = _profiles()
    assert profiles
    assert len({p["machine"]["cpu_class"] for p in profiles}) == len(profiles)
    for p in profiles:
        assert set(p["dtypes"]) == {"bfloat16", "float32"}
        assert p["command"].startswith("agentserve bench calibrate")
        assert p["gemm"] == "vllm", "the engine's own GEMMs were timed"


def test_each_recorded_choice_is_what_choose_makes_now():
    for profile in _profiles():
        choice = _choose(profile)
        recorded = profile["choice"]
        assert (choice.dtype, choice.method, choice.num_speculative_tokens) == (
            recorded["dtype"],
            recorded["method"],
            recorded["num_speculative_tokens"],
        ), "the logic changed: rerun `agentserve bench calibrate --report-only`"
        if choice.method is not None:  # speculation only where it is predicted to pay
            assert choice.predicted_speedup >= MIN_GAIN
            assert choice.predicted_speedup_loaded >= 1.0
        else:
            assert "no speculative method" in choice.reason


def test_where_served_figures_exist_the_calibrated_choice_agrees_with_them():
    for profile in _profiles():
        machine = profile["machine"]["cpu_class"]
        if profile.get("emulated") or not has_served_speculation(BUNDLED_MODEL, machine):
            continue
        # at the k the served rows measured (SERVED_FACTOR is fitted there; other ks are
        # extrapolation, which the served figures cannot confirm), or where the profile did
        # not time that verification's size, the largest k below it that it timed
        measured_k = default_speculation_tokens(BUNDLED_MODEL, machine)
        timed = {int(n) - 1 for n in profile["dtypes"]["bfloat16"]["step_ms"]["1"]}
        ks = None if measured_k is None else {max(k for k in timed if k <= measured_k)}
        choice = choose(
            profile, MEASURED_ACCEPTANCE, FRACTIONS, SERVED_FACTOR, ks=ks,
            served_factor_loaded=SERVED_FACTOR_LOADED,
        )  # fmt: skip
        assert choice.method == default_speculation(BUNDLED_MODEL, machine), choice.reason


def test_the_served_factor_is_the_one_the_figures_give():
    rows = rows_of_shipped_drafter(json.loads((BENCH / "speculative.json").read_text()))
    assert served_factors(_profiles(), rows, FRACTIONS) == SERVED_FACTOR
    assert served_factors(_profiles(), rows, FRACTIONS, LOADED_BATCH) == SERVED_FACTOR_LOADED


def test_the_loaded_check_uses_its_own_factor():
    """vLLM's fixed cost per speculative step weighs less in a bigger batch: a factor
    fitted at concurrency 1 alone made the loaded check refuse n-gram on a machine where
    it served 1.4-2.0x plain at concurrency 4."""
    profile = _flat_profile(decode_ms=10.0, verify_ms=15.0)  # verify k=4: 1.5x a decode
    acceptance = {"ngram": (0.85, 0.07)}
    strict = choose(profile, acceptance, served_factor={"ngram": 0.5}, ks={4})
    assert strict.method is None and strict.predicted_speedup_loaded == 1.0
    loaded = choose(profile, acceptance, served_factor={"ngram": 0.5}, ks={4},
                    served_factor_loaded={"ngram": 0.8})  # fmt: skip
    assert loaded.method == "ngram" and loaded.predicted_speedup_loaded > 1.0


def test_the_choice_predicts_the_served_speedup_it_was_corrected_by():
    """choose() scales predicted_speedup(..., draft fraction) by SERVED_FACTOR: for the
    served row that sets a method's factor this gives back the measured speedup, so the
    drafting is counted once (a factor fitted without it counted DFlash's drafting twice)."""
    rows = rows_of_shipped_drafter(json.loads((BENCH / "speculative.json").read_text()))
    by_class = {p["machine"]["cpu_class"]: p for p in _profiles()}
    for method, factor in SERVED_FACTOR.items():
        ratios = []  # corrected prediction / measured: at most 1, and 1 on the setting row
        for r in factor_rows(rows, set(by_class)):  # the rows the factor is fitted to
            if r["method"] != method:
                continue
            profile = by_class[r["machine"]["cpu_class"]]
            k, frac = int(r["num_speculative_tokens"]), FRACTIONS[method]
            if str(k + 1) not in profile["dtypes"][r["dtype"]]["step_ms"]["1"]:
                continue  # a k the profile did not time: served_factors skips it too
            predicted = predicted_speedup(profile, r["dtype"], 1, k, float(r["tau"]), frac)
            ratios.append(factor * predicted / r["speedup_vs_plain"])
        assert max(ratios) == pytest.approx(1.0, abs=0.01), (method, ratios)


def test_verification_that_costs_more_than_it_returns_means_plain_decoding():
    slow = copy.deepcopy(_profiles()[0])
    for costs in slow["dtypes"].values():
        for by_tokens in costs["step_ms"].values():
            one = by_tokens["1"]
            for n in by_tokens:
                by_tokens[n] = one * int(n)  # every verified token costs a whole step
    choice = _choose(slow)
    assert choice.method is None and choice.predicted_speedup == 1.0
    assert "no speculative method is predicted" in choice.reason


def test_cheap_verification_picks_the_method_with_the_best_acceptance():
    flat = copy.deepcopy(_profiles()[0])
    for costs in flat["dtypes"].values():
        for by_tokens in costs["step_ms"].values():
            for n in by_tokens:
                by_tokens[n] = by_tokens["1"]  # verifying 8 tokens costs what 1 does
    choice = choose(flat, {"ngram": (0.8, 0.0), "dflash": (0.3, 0.0)}, FRACTIONS)
    assert choice.method == "ngram" and choice.num_speculative_tokens == 7
    # the slower dtype's speculation is not chosen over the faster dtype's
    fast = min(flat["dtypes"], key=lambda d: flat["dtypes"][d]["step_ms"]["1"]["1"])
    assert choice.dtype == fast


def _fake_choice(method="ngram", k=3, dtype="float32") -> Choice:
    return Choice(dtype, method, k, 1.8, 1.2, "predicted")


def test_an_unmeasured_cpu_gets_the_calibrated_method_k_and_dtype(monkeypatch):
    monkeypatch.setattr(spec_defaults, "machine_class", lambda: "avx512")
    monkeypatch.setattr(spec_defaults, "_calibrate_choice", lambda *a: _fake_choice())
    decisions: dict = {}
    spec, notes = spec_defaults.resolve_drafters(DeploymentSpec(), decisions=decisions)
    (model,) = spec.models
    assert model.drafter.enabled and model.drafter.method == "ngram"
    assert model.drafter.num_speculative_tokens == 3 and model.dtype == "float32"
    assert any("calibrated on this machine (avx512)" in n for n in notes)
    assert decisions[model.name]["decided_by"] == "calibration"
    assert decisions[model.name]["predicted_speedup"] == 1.8


def test_a_calibrated_plain_choice_and_the_spec_win_where_set(monkeypatch):
    monkeypatch.setattr(spec_defaults, "machine_class", lambda: "avx512")
    plain = _fake_choice(None, 0, "bfloat16")
    monkeypatch.setattr(spec_defaults, "_calibrate_choice", lambda *a: plain)
    spec, notes = spec_defaults.resolve_drafters(DeploymentSpec())
    assert not spec.models[0].drafter.enabled
    assert any("no speculative decoding" in n for n in notes)
    data = DeploymentSpec().model_dump(mode="json")
    data["models"][0]["dtype"] = "bfloat16"
    data["models"][0]["drafter"]["method"] = "ngram"
    monkeypatch.setattr(spec_defaults, "_calibrate_choice", lambda *a: _fake_choice())
    spec, _ = spec_defaults.resolve_drafters(DeploymentSpec.model_validate(data))
    assert spec.models[0].dtype == "bfloat16" and spec.models[0].drafter.method == "ngram"


def test_measured_cpus_and_flags_do_not_calibrate(monkeypatch):
    def boom(*_):
        raise AssertionError("calibrated")

    monkeypatch.setattr(spec_defaults, "_calibrate_choice", boom)
    monkeypatch.setattr(spec_defaults, "machine_class", lambda: "avx2")
    spec_defaults.resolve_drafters(DeploymentSpec())
    monkeypatch.setattr(spec_defaults, "machine_class", lambda: "avx512")
    spec_defaults.resolve_drafters(DeploymentSpec(), flag=False)
    monkeypatch.setenv("AGENTSERVE_CALIBRATE", "0")
    decisions: dict = {}
    spec, _ = spec_defaults.resolve_drafters(DeploymentSpec(), decisions=decisions)
    assert not spec.models[0].drafter.enabled
    assert decisions[spec.models[0].name]["decided_by"] == "no figures"


def test_served_factors_read_a_methods_schedule_off_rows_where_it_has_them():
    """Under the schedule a row's k and tau are those of the batches that drafted: a c=4
    row that drafted nothing at batch 4 still reports k=3 and its batch-1 tau, and divided
    by the speedup predicted for k=3 at that tau gave DFlash a loaded factor of 0.36. Where
    a method has rows drafting k at every batch on that kind of CPU, only those count."""
    profile = _flat_profile(decode_ms=10.0, verify_ms=12.0)
    machine = {"cpu_class": profile["machine"]["cpu_class"]}
    dtype = next(iter(profile["dtypes"]))

    def row(method, settings, speedup, tau):
        return {"path": "served", "server": "agentserve", "machine": machine, "dtype": dtype,
                "method": method, "concurrency": 4, "num_speculative_tokens": 3,
                "settings": settings, "tau": tau, "speedup_vs_plain": speedup}  # fmt: skip

    default = default_settings(machine["cpu_class"])
    scheduled = row("dflash", default, 0.85, 3.3)
    off = row("dflash", default + SCHEDULE_OFF, 1.0, 1.8)
    ngram = row("ngram", default, 1.5, 3.0)
    alone = served_factors([profile], [scheduled, ngram], concurrency=4)
    both = served_factors([profile], [scheduled, off, ngram], concurrency=4)
    predicted = predicted_speedup(profile, dtype, 4, 3, 1.8)
    assert both["dflash"] == round(1.0 / predicted, 3) > alone["dflash"]
    assert both["ngram"] == alone["ngram"]  # a method without schedule-off rows keeps its own

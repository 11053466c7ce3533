"""Speculation shed under overload (issue 19 item 2): deployments fill each drafter's
per-batch schedule by default, vLLM takes it, the policy plans with it, and the simulator
counts the capacity it frees."""

from __future__ import annotations

from dataclasses import replace

import pytest
from agentserve.autoscale.model import LatencyModel, drafted_for, speculation_schedule
from agentserve.autoscale.policy import capacity_floor
from agentserve.autoscale.policy_types import PolicySpec, Snapshot
from agentserve.autoscale.ray_policy import policy_spec_from_json, policy_spec_to_json
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.spec import DeploymentSpec
from agentserve.spec.defaults import with_default_drafters
from agentserve.speculation.schedule import (
    latency_model_for,
    schedule_for,
    with_default_schedules,
)
from agentserve_bench.autoscale.compare import Scenario, policy_spec_for, saturated_capacity
from agentserve_bench.autoscale.simulate import SimConfig, simulate
from agentserve_bench.autoscale.trace import Call, Session, Trace, TraceConfig
from profile_fakes import set_profile

# n-gram's schedule (16 seqs, k 7) from the CPU step model and n-gram's acceptance and draft
# rate measured through the server (speculation.schedule.method_acceptance, method_draft_rate);
# follows the committed figures
CPU_SCHEDULE = [[1, 1, 7], [2, 2, 6], [3, 4, 4], [5, 7, 3], [8, 14, 2], [15, 16, 1]]


@pytest.fixture(autouse=True)
def _whole_engine_fit(monkeypatch):
    """These tests hold the whole-engine CPU fit's schedule, whatever kind of CPU runs
    them (a kind with recorded step costs would plan with those: see the last test)."""
    monkeypatch.setenv("AGENTSERVE_CALIBRATE", "0")


def _spec(**drafter) -> DeploymentSpec:
    return DeploymentSpec.model_validate(
        {"models": [{"drafter": {"enabled": True, "method": "ngram", **drafter}}]}
    )


def test_default_fills_the_schedule_of_the_measured_model():
    spec = _spec()
    out = with_default_schedules(spec)
    assert out.models[0].drafter.num_speculative_tokens_per_batch_size == CPU_SCHEDULE
    assert out.models[0].drafter.num_speculative_tokens_per_batch_size == schedule_for(
        spec.models[0], latency_model_for(spec.models[0])
    )
    # not the acceptance assumed for every method before it was measured
    assert schedule_for(spec.models[0], LatencyModel()) != CPU_SCHEDULE
    assert spec.models[0].drafter.num_speculative_tokens_per_batch_size is None  # a copy
    assert with_default_schedules(out) == out  # idempotent


def test_explicit_schedule_wins_and_off_leaves_it_unset():
    explicit = [[1, 2, 7], [3, 8, 0]]
    kept = with_default_schedules(_spec(num_speculative_tokens_per_batch_size=explicit))
    assert kept.models[0].drafter.num_speculative_tokens_per_batch_size == explicit
    off = with_default_schedules(_spec(speculation_schedule="off"))
    assert off.models[0].drafter.num_speculative_tokens_per_batch_size is None


@pytest.mark.parametrize(
    "model",
    [
        {"drafter": {"enabled": False}},
        {"engine": "fake", "drafter": {"enabled": True, "method": "ngram"}},
        {"replicas": {"num_gpus": 1}, "drafter": {"enabled": True, "method": "ngram"}},
        {"source": "./other-model", "drafter": {"enabled": True, "method": "ngram"}},
    ],
)
def test_no_schedule_without_a_latency_model_measured_for_the_deployment(model):
    spec = DeploymentSpec.model_validate({"models": [model]})
    assert with_default_schedules(spec) is spec


def test_up_defaults_fill_it_and_the_engine_kwargs_carry_it(tmp_path):
    spec, _ = with_default_drafters(DeploymentSpec(), None, lambda _: None, lambda _: "ngram")
    model = spec.models[0]
    assert model.drafter.enabled and model.drafter.method == "ngram"
    assert model.drafter.num_speculative_tokens_per_batch_size == CPU_SCHEDULE
    kwargs = engine_kwargs(model, tmp_path)
    cfg = kwargs["speculative_config"]
    assert cfg["num_speculative_tokens_per_batch_size"] == [tuple(r) for r in CPU_SCHEDULE]
    off, _ = with_default_drafters(_spec(speculation_schedule="off"), None, lambda _: None)
    assert (
        "num_speculative_tokens_per_batch_size"
        not in engine_kwargs(off.models[0], tmp_path)["speculative_config"]
    )


def test_vllm_expands_the_schedule_to_the_batch_sizes_we_planned(tmp_path):
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    model = with_default_schedules(_spec()).models[0]
    cfg = engine_kwargs(model, tmp_path)["speculative_config"]
    dense = utils.build_dynamic_sd_schedule_lookup(
        cfg["num_speculative_tokens_per_batch_size"],
        vllm_max_batch_size=model.max_num_seqs,
        vllm_num_speculative_tokens=cfg["num_speculative_tokens"],
    )
    wanted = [drafted_for(CPU_SCHEDULE, b) for b in range(1, model.max_num_seqs + 1)]
    assert dense[1:] == wanted


def test_operator_resolves_the_same_schedule():
    from agentserve_operator.resource import desired_from_cr

    cr_model = {
        "name": "smol",
        "drafter": {"enabled": True, "method": "ngram"},
        "replicas": {"min_replicas": 1, "max_replicas": 2},
    }
    cr = {
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {
            "models": [cr_model],
            "tenants": [
                {
                    "name": "alice",
                    "api_key_sha256": "a" * 64,
                    "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50},
                }
            ],
        },
    }
    desired = desired_from_cr(cr, None)
    served, _ = with_default_drafters(
        DeploymentSpec.model_validate({"models": [cr_model]}), None, lambda _: None
    )
    got = desired.spec.models[0].drafter.num_speculative_tokens_per_batch_size
    assert got == served.models[0].drafter.num_speculative_tokens_per_batch_size == CPU_SCHEDULE


def test_policy_plans_with_what_the_replica_drafts():
    scheduled = with_default_schedules(_spec())
    latency = latency_model_for(scheduled.models[0])
    spec = PolicySpec.from_deployment(scheduled, latency_model=latency)
    assert spec.schedule == tuple(tuple(r) for r in CPU_SCHEDULE)
    assert policy_spec_from_json(policy_spec_to_json(spec)) == spec  # Ray's policy_kwargs
    fixed = PolicySpec.from_deployment(
        _spec(speculation_schedule="off"), latency_model=LatencyModel()
    )
    assert fixed.schedule == ((1, 16, 7),)
    snap = Snapshot(now_s=0.0, ready_replicas=1, arrival_rate_rps=3.0, mean_output_tokens=200.0)
    # drafting 7 at every batch leaves less capacity per replica: the floor plans more
    assert capacity_floor(snap, fixed) > capacity_floor(snap, spec)


def test_scheduled_capacity_at_saturation_is_at_least_fixed_and_plain_where_k_is_0():
    cap = saturated_capacity(Scenario())
    assert cap["schedule"] >= cap["fixed_k"] and cap["schedule"] >= cap["plain"]
    assert cap["schedule_k"] == 1
    # a drafter whose acceptance collapses with the batch: k(8) = 0, so the saturated
    # replica runs at exactly plain throughput while the fixed k runs far below it
    weak = LatencyModel(alpha_1=0.8, alpha_drop_per_doubling=0.25)
    assert drafted_for(speculation_schedule(weak, 8, 7), 8) == 0
    cap = saturated_capacity(Scenario(model=weak))
    assert cap["schedule_k"] == 0 and cap["schedule"] == cap["plain"]
    assert cap["fixed_k"] < 0.5 * cap["plain"]


def _saturating_trace(requests: int = 64) -> Trace:
    """Every request at t=0 on one replica: it runs at max_num_seqs until the queue drains."""
    calls = (Call(prompt_tokens=16, output_tokens=64, pause_s=0.0, new_tokens=16),)
    sessions = tuple(Session(i, "batch", 0.0, calls) for i in range(requests))
    return Trace(TraceConfig(duration_s=1.0), sessions)


def _makespan(model: LatencyModel, **cfg) -> float:
    sim = SimConfig(model=model, initial_replicas=1, **cfg)
    result = simulate(_saturating_trace(), lambda _s: 1, sim)
    return max(q.finish_s for q in result.requests)


def test_saturated_simulated_replica_sheds_speculation():
    weak = LatencyModel(alpha_1=0.8, alpha_drop_per_doubling=0.25)
    scheduled = _makespan(weak)
    fixed = _makespan(weak, adaptive_speculation=False)
    plain = _makespan(weak, max_drafted=0)
    assert scheduled < fixed
    # only the last few sequences of the drain (batch < 8) draft at all
    assert scheduled == pytest.approx(plain, rel=0.1)
    assert _makespan(LatencyModel()) <= _makespan(LatencyModel(), adaptive_speculation=False)


def test_bench_fixed_speculation_runs_every_fleet_with_the_fixed_k():
    sc = Scenario(speculation="fixed", max_drafted=5)
    assert policy_spec_for(sc).schedule == ((1, 8, 5),)
    assert policy_spec_for(replace(sc, speculation="schedule")).schedule is None


def test_on_a_calibrated_cpu_the_schedule_drafts_where_the_server_measured_gains(monkeypatch):
    """AMD EPYC with AVX-512 bf16 (recorded step costs, calibrated_model): n-gram k=4
    served 1.5-1.9x plain at concurrency 4 there, so the schedule drafts at batch 4. One
    factor fitted at concurrency 1 for every batch turns speculation off at a smaller batch
    than the factor fitted at concurrency 4 (with the figures of 2026-11-27 morning: from
    batch 4). (That kind now plans with its served fit, served_fit.py; this holds the
    calibrated model a kind without one gets.)"""
    monkeypatch.delenv("AGENTSERVE_CALIBRATE")
    set_profile(monkeypatch, "avx512_bf16", served_fit=None)
    model = _spec().models[0]
    latency = latency_model_for(model, "avx512_bf16")
    assert latency.speculative_step_factor_loaded < latency.speculative_step_factor
    schedule = schedule_for(model, latency)
    assert drafted_for(schedule, 1) == 7 and drafted_for(schedule, 4) >= 2
    flat = replace(latency, speculative_step_factor_loaded=None)

    def last_drafting(s):
        return max(b for b in range(1, model.max_num_seqs + 1) if drafted_for(s, b) > 0)

    assert last_drafting(schedule_for(model, flat)) < last_drafting(schedule)

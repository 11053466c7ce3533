"""The live autoscaling run's pure parts: the scaled-down trace, the prompts, attainment and
percentiles per tenant, the replica timeline, the phase specs and the CLI options."""

from __future__ import annotations

import argparse

import pytest
from agentserve.spec import hash_api_key
from agentserve_bench.autoscale.live import KEYS, PRESETS, live_spec
from agentserve_bench.autoscale.live_bench import (
    add_parser,
    command_line,
    config_from_args,
    markdown_summary,
    timeline_text,
)
from agentserve_bench.autoscale.live_trace import (
    Record,
    attained,
    generate_live,
    in_burst,
    live_trace_config,
    nearest_rank,
    phase_report,
    prompt_text,
    replica_seconds,
    scale_up_s,
    scaled_up_and_down,
)


def _record(tenant="interactive", status=200, ttft=100.0, tpot=50.0, burst=False, error=None):
    return Record(tenant, 0, 1.0, status, ttft, tpot, 32, burst, error)


# -- trace -------------------------------------------------------------------------------------
def test_the_trace_scales_to_minutes_with_the_burst_in_the_second_and_third_sevenths():
    cfg = live_trace_config(duration_s=210, rate_scale=1.0, seed=7)
    assert (cfg.burst_start_s, cfg.burst_s, cfg.burst_factor) == (60.0, 60.0, 3.0)
    assert cfg.diurnal_low == 1.0  # flat outside the burst
    assert in_burst(cfg, 60.0) and in_burst(cfg, 119.9) and not in_burst(cfg, 120.0)
    assert not in_burst(cfg, 59.9)
    sessions = generate_live(cfg, max_prompt_tokens=240, max_output_tokens=160)
    assert sessions == generate_live(cfg, 240, 160)  # seeded
    starts = {t: [s.start_s for s in sessions if s.tenant == t] for t in ("interactive", "batch")}
    assert all(0 <= s < 210 for v in starts.values() for s in v)
    inside = sum(in_burst(cfg, s) for s in starts["interactive"])
    outside = len(starts["interactive"]) - inside  # 150 s outside vs 60 s inside at 3x
    assert inside / 60 > 2 * outside / 150, (inside, outside)
    assert 40 <= outside <= 80  # ~20 a minute
    assert 4 <= len(starts["batch"]) <= 20  # ~3 a minute
    calls = [c for s in sessions for c in s.calls]
    assert max(c.prompt_tokens for c in calls) <= 240 and max(c.output_tokens for c in calls) <= 160
    assert max(c.prompt_tokens for c in calls) == 240  # lognormal tails were capped


def test_rate_scale_multiplies_the_sessions():
    base = generate_live(live_trace_config(210, 1.0), 240, 160)
    double = generate_live(live_trace_config(210, 2.0), 240, 160)
    assert 1.6 < len(double) / len(base) < 2.4


def test_prompts_are_distinct_and_about_the_asked_length():
    a, b, c = prompt_text(1, 0, 100), prompt_text(1, 1, 100), prompt_text(2, 0, 100)
    assert len({a, b, c}) == 3 and a.split()[:4] != b.split()[:4]
    assert len(a.split()) == 100
    assert len(prompt_text(3, 0, 2).split()) == 5  # the head (4 words) and one word at least


# -- statistics ------------------------------------------------------------------------------
def test_nearest_rank_is_a_value_some_request_had():
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert nearest_rank(values, 0.95) == 19.0 and nearest_rank(values, 0.5) == 10.0
    assert nearest_rank([5.0], 0.95) == 5.0 and nearest_rank([], 0.5) is None


@pytest.mark.parametrize(
    ("record", "ok"),
    [
        (_record(ttft=1500.0, tpot=120.0), True),  # on the objective is within it
        (_record(ttft=1501.0), False),
        (_record(tpot=121.0), False),
        (_record(tpot=None), True),  # one token: no TPOT
        (_record(status=429, ttft=None, tpot=None), False),  # shed: not served
        (_record(error="engine died"), False),  # a stream that ended in an error
    ],
)
def test_attained_means_served_within_both_objectives(record, ok):
    assert attained(record, 1500.0, 120.0) is ok


def test_phase_report_per_tenant_inside_and_outside_the_burst():
    records = [
        _record(ttft=100.0, tpot=40.0),
        _record(ttft=3000.0, tpot=40.0, burst=True),
        _record(ttft=200.0, tpot=60.0, burst=True),
        _record(tenant="batch", status=429, ttft=None, tpot=None, burst=True),
        _record(tenant="batch", ttft=9000.0, tpot=300.0),
    ]
    report = phase_report(records, {"interactive": (1500, 120), "batch": (20000, 1000)})
    i, b = report["interactive"], report["batch"]
    assert (i["requests"], i["attainment"]) == (3, 0.6667)
    assert (i["attainment_outside_burst"], i["attainment_in_burst"]) == (1.0, 0.5)
    assert (i["ttft_p50_ms"], i["ttft_p95_ms"], i["tpot_p95_ms"]) == (200.0, 3000.0, 60.0)
    assert b["statuses"] == {"200": 1, "429": 1} and b["attainment"] == 0.5
    assert b["attainment_in_burst"] == 0.0 and b["ttft_p95_ms"] == 9000.0


def _points(*pairs):
    return [{"t_s": t, "running": n, "states": {"RUNNING": n}} for t, n in pairs]


@pytest.mark.parametrize(
    ("pairs", "went"),
    [
        (((0, 1), (40, 2), (150, 1)), True),
        (((0, 1), (40, 2)), False),  # never back
        (((0, 1), (30, 0), (31, 1)), False),  # a restart is not a scale-up
        (((0, 1), (40, 2), (60, 1), (80, 2)), True),
        (((0, 2), (10, 1)), False),  # did not start from one
    ],
)
def test_scaled_up_and_down_follows_running_replicas_in_order(pairs, went):
    assert scaled_up_and_down(_points(*pairs)) is went


def test_scale_up_s_runs_from_the_first_starting_replica_to_one_more_running():
    timeline = [
        {"t_s": 0.0, "running": 1, "states": {"RUNNING": 1}},
        {"t_s": 19.3, "running": 1, "states": {"RUNNING": 1, "STARTING": 1}},
        {"t_s": 88.7, "running": 2, "states": {"RUNNING": 2}},
        {"t_s": 270.5, "running": 1, "states": {"RUNNING": 1, "STOPPING": 1}},
    ]
    assert scale_up_s(timeline) == 69.4
    assert scale_up_s(_points((0, 1), (40, 1))) is None  # never scaled up
    assert scale_up_s(timeline[:2]) is None  # still starting at the end


def test_replica_seconds_integrates_running_replicas_to_the_end():
    assert replica_seconds(_points((0, 1), (40, 2), (100, 1)), 160.0) == 40 + 120 + 60
    assert replica_seconds([], 10.0) == 0.0


def test_timeline_text_shows_the_changes_of_running_replicas():
    points = _points((0, 1), (40, 2), (41, 2), (150, 1))
    assert timeline_text(points) == "1 (0 s) -> 2 (40 s) -> 1 (150 s)"


# -- specs and options -----------------------------------------------------------------------
def test_priority_off_is_arrival_order_without_engine_priority_and_on_is_both():
    cfg = PRESETS["vllm"]
    off, on = live_spec(cfg, priority=False), live_spec(cfg, priority=True)
    assert (off.models[0].dispatch_order, off.models[0].priority_scheduling) == ("arrival", False)
    assert (on.models[0].dispatch_order, on.models[0].priority_scheduling) == ("deadline", True)
    model = on.models[0]
    assert (model.replicas.min_replicas, model.replicas.max_replicas) == (1, 2)
    assert model.engine == "vllm" and not model.drafter.enabled
    # compiled or eager is the CPU's choice (the machine profile's `compile`), as for agentserve up
    assert "enforce_eager" not in model.engine_args
    assert on.autoscaling.policy == "sla"
    tenants = {t.name: t for t in on.tenants}
    assert tenants["batch"].sla_class == "batch" and tenants["interactive"].sla_class is None
    assert tenants["interactive"].sla.ttft_p95_ms < tenants["batch"].sla.ttft_p95_ms
    assert {t.api_key_sha256 for t in on.tenants} == {hash_api_key(k) for k in KEYS.values()}


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["autoscale-live", *argv])


def test_options_override_the_engine_preset_and_make_the_command_line():
    args = _args("--engine", "fake", "--duration-s", "30", "--interactive-sla", "800,60")
    cfg = config_from_args(args)
    assert (cfg.engine, cfg.duration_s, cfg.interactive_sla) == ("fake", 30.0, (800.0, 60.0))
    assert cfg.rate_scale == PRESETS["fake"].rate_scale
    line = command_line(args)
    assert line.startswith("agentserve bench autoscale-live --engine fake --duration-s 30.0")
    assert "--interactive-sla 800,60" in line and "--out" not in line  # the default
    assert command_line(_args("--out", "x.json")).endswith("--engine vllm --out x.json")
    assert str(args.out).endswith("docs/benchmarks/autoscale_live.json")
    assert args.out.is_absolute()  # the repository's docs/, whatever the working directory
    with pytest.raises(ValueError, match="--phases"):
        config_from_args(_args("--phases", "off,fifo"))


def test_markdown_summary_has_a_row_per_phase_and_tenant_and_the_verdicts():
    tenants = phase_report([_record(), _record(tenant="batch")], {"interactive": (1500, 120),
                           "batch": (20000, 1000)})  # fmt: skip
    phase = {
        "tenants": tenants,
        "timeline": _points((0, 1), (40, 2), (150, 1)),
        "scaled_1_2_1": True,
        "replica_seconds": 300.0,
        "replay_s": 210.0,
    }
    report = {
        "phases": {"off": phase, "on": phase},
        "interactive_attainment": {"off": 0.5, "on": 0.9},
        "priority_helps_interactive": True,
    }
    text = markdown_summary(report)
    assert text.count("| off |") == 2 and text.count("| on |") == 2
    assert "1 (0 s) -> 2 (40 s) -> 1 (150 s)" in text
    assert "90.0% vs 50.0% (higher with priority)" in text

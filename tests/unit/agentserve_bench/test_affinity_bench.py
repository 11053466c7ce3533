"""agentserve_bench/affinity.py (`agentserve bench affinity`): the two-routing spec, the
agent turns, the figures and the paired summary; the command registers (not run here)."""

from __future__ import annotations

import pytest
from agentserve.cli import build_parser
from agentserve.spec import DeploymentSpec
from agentserve_bench.affinity import (
    arm_figures,
    round_openings,
    run,
    section,
    summarize,
    tool_turn,
    two_routing_spec,
)
from agentserve_bench.served_client import Reply


def test_the_two_models_differ_only_in_routing():
    base = DeploymentSpec.model_validate({"models": [{"name": "m", "engine": "fake"}]})
    spec, names = two_routing_spec(base, replicas=2)
    assert names == {"spread": "m-spread", "affinity": "m-affinity"}
    spread, affinity = spec.models
    assert (spread.routing.affinity, affinity.routing.affinity) == (False, True)
    assert spread.replicas.min_replicas == spread.replicas.max_replicas == 2
    skip = {"name", "routing"}
    assert spread.model_dump(exclude=skip) == affinity.model_dump(exclude=skip)


def test_a_turn_appends_the_call_and_its_result():
    assistant, tool = tool_turn(2, "reading", "x" * 5000)
    assert assistant["tool_calls"][0]["id"] == tool["tool_call_id"] == "call_2"
    assert assistant["content"] == "reading" and len(tool["content"]) == 600


def _reply(ttft_s: float, prompt: int, cached: int, tokens: int = 4) -> Reply:
    return Reply(0.0, ttft_s, ttft_s + 1, tokens, "t", prompt, cached)


def test_arm_figures_hit_rate_quantiles_throughput():
    replies = [_reply(0.1 * i, 100, 50 if i % 2 else 0) for i in range(1, 11)]
    f = arm_figures(replies, wall_s=8.0)
    assert (f["prompt_tokens"], f["cached_tokens"], f["prefix_hit_rate"]) == (1000, 250, 0.25)
    assert (f["ttft_ms_p50"], f["ttft_ms_p90"]) == (550.0, 910.0)
    assert f["throughput_tokens_per_s"] == 5.0


def _row(i, arm, workload, hit, p50, tps):
    return {"kind": "run", "round": i, "arm": arm, "workload": workload,
            "prefix_hit_rate": hit, "ttft_ms_p50": p50, "ttft_ms_p90": p50 * 2,
            "throughput_tokens_per_s": tps}  # fmt: skip


def test_summary_pairs_rounds_per_workload():
    rows = [
        _row(0, "spread", "agent", 0.2, 400.0, 10.0),
        _row(0, "affinity", "agent", 0.6, 200.0, 12.0),
        _row(1, "affinity", "agent", 0.5, 300.0, 9.0),
        _row(1, "spread", "agent", 0.25, 600.0, 9.0),
        _row(2, "spread", "agent", 0.0, 100.0, 1.0),  # unpaired: left out
        _row(0, "spread", "single-turn", 0.0, 100.0, 20.0),
        _row(0, "affinity", "single-turn", 0.0, 100.0, 20.0),
    ]  # fmt: skip
    agent, single = summarize(rows)
    assert (agent["workload"], agent["rounds"]) == ("agent", 2)
    assert agent["prefix_hit_rate"] == [0.225, 0.55]
    assert agent["prefix_hit_rate_ratio_median"] == 2.5  # median of 3.0 and 2.0
    assert agent["ttft_ms_p50_ratio_median"] == 0.5
    assert single["prefix_hit_rate_ratio_median"] is None  # spread hit nothing: no ratio
    assert single["throughput_tokens_per_s_ratio_median"] == 1.0


def test_section_lists_each_figure_per_cpu():
    rows = [
        _row(0, "spread", "agent", 0.2, 400.0, 10.0),
        _row(0, "affinity", "agent", 0.6, 200.0, 12.0),
    ]
    machine = {
        "machine": {"cpu_class": "avx2"},
        "date": "2025-01-01",
        "command": "agentserve bench affinity",
    }
    records = [{**r, **machine} for r in rows + summarize(rows)]
    text = section(records)
    assert "avx2" in text and "| agent | prefix_hit_rate | 0.2 | 0.6 | 3.0 |" in text


def test_the_command_registers_with_its_defaults():
    args = build_parser().parse_args(["bench", "affinity"])
    assert args.handler is run
    assert (args.conversations, args.turns, args.replicas, args.sessions) == (8, 6, 2, True)
    assert build_parser().parse_args(["bench", "affinity", "--no-sessions"]).sessions is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "affinity", "--engine", "sglang"])


def _agents(n: int) -> list:
    opening = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "go"},
    ]
    return [(list(opening), [f"result {i}"]) for i in range(n)]


def test_shared_openings_share_the_first_message_distinct_ones_do_not():
    agents = _agents(3)
    shared = round_openings(agents, "r0-spread", distinct=False)
    distinct = round_openings(agents, "r0-spread", distinct=True)
    firsts = {conv[0][0]["content"] for conv in shared}
    assert firsts == {"[r0-spread] You are an agent."}
    firsts = [conv[0][0]["content"] for conv in distinct]
    assert len(set(firsts)) == 3 and all(f.startswith("[r0-spread #") for f in firsts)
    # the tag leads the prompt (no block in common); the rest and the results are kept
    assert [conv[0][1:] for conv in distinct] == [agent[0][1:] for agent in agents]
    assert [conv[1] for conv in distinct] == [agent[1] for agent in agents]
    assert agents[0][0][0]["content"] == "You are an agent."  # the input is not mutated


def test_openings_option():
    parse = build_parser().parse_args
    assert parse(["bench", "affinity"]).openings == ("shared", "distinct")
    assert parse(["bench", "affinity", "--openings", "distinct"]).openings == ("distinct",)
    with pytest.raises(SystemExit):
        parse(["bench", "affinity", "--openings", "unique"])

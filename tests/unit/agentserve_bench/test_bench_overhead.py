"""`agentserve bench overhead`: statistics and ratios from timings, and the whole command on
the fake engine with the platform phase served by the Ray-free ingress over real HTTP
(uvicorn in a thread); tests/integration/test_bench_overhead_ray.py runs it on Ray Serve."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from agentserve.cli import build_parser
from agentserve_bench.fake_engine import FakeEngine
from agentserve_bench.overhead import (
    Plan,
    RequestTiming,
    compare_systems,
    http_levels,
    level_stats,
    run,
)
from agentserve_bench.overhead_requests import engine_request_fn
from agentserve_bench.overhead_stats import run_level, verdict

DOC = """# Benchmarks

Intro stays.

<!-- platform-overhead:begin -->
old
<!-- platform-overhead:end -->
"""


def test_level_stats_from_timings():
    # two requests: 5 tokens over 40 ms after a 10 ms first token; 3 tokens over 20 ms
    timings = [RequestTiming(0.0, 0.010, 0.050, 5, 7), RequestTiming(0.0, 0.030, 0.050, 3, 9)]
    stats = level_stats(timings, wall_s=0.05)
    assert stats["tpot_ms"] == 10.0  # (40/4 + 20/2) / 2
    assert stats["ttft_ms"] == 20.0 and stats["tokens_per_s"] == 160.0
    assert (stats["output_tokens"], stats["prompt_tokens"], stats["requests"]) == (8, 16, 2)
    assert RequestTiming(0.0, 0.01, 0.01, 1, 3).tpot_ms is None


def _figures(tps, tpot, tokens=100):
    return {"tokens_per_s": tps, "tpot_ms": tpot, "output_tokens": tokens, "prompt_tokens": 50}


def test_ratios_are_to_the_reference_and_the_target_is_issue_15s():
    systems = {
        "bare": {1: _figures(110.0, 9.0), 16: _figures(400.0, 30.0)},
        "vllm_serve": {1: _figures(100.0, 10.0), 16: _figures(380.0, 40.0)},
        "agentserve": {1: _figures(96.0, 10.4), 16: _figures(350.0, 45.0, tokens=99)},
    }
    levels = compare_systems(systems, "vllm_serve")
    assert [lv["concurrency"] for lv in levels] == [1, 16]
    low, high = levels
    assert low["tpot_ratio"] == {"bare": 0.9, "vllm_serve": 1.0, "agentserve": 1.04}
    assert low["throughput_ratio"]["agentserve"] == 0.96
    assert high["throughput_ratio"]["agentserve"] == round(350 / 380, 4)
    assert all(low["same_tokens"].values()) and not high["same_tokens"]["agentserve"]
    target = verdict(levels, "vllm_serve", "agentserve")
    assert target["met"]  # 1.04x TPOT at c=1, 0.92x throughput at c=16
    assert target["throughput_scaling"] == {"1": 1.0, "16": round(350 / 96, 4)}
    systems["agentserve"][16] = _figures(300.0, 45.0)  # 0.79x at the highest level
    assert not verdict(compare_systems(systems, "vllm_serve"), "vllm_serve", "agentserve")["met"]
    systems["agentserve"] = {1: _figures(100.0, 10.6), 16: _figures(380.0, 40.0)}  # TPOT 1.06x
    assert not verdict(compare_systems(systems, "vllm_serve"), "vllm_serve", "agentserve")["met"]


def test_run_level_keeps_the_concurrency():
    running, peak, seen = 0, 0, []

    async def one(request_id: str, prompt: str) -> RequestTiming:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        seen.append((request_id, prompt))
        await asyncio.sleep(0.01)
        running -= 1
        return RequestTiming(0.0, 0.0, 0.0, 2, 1)

    timings, wall_s = asyncio.run(run_level(one, ["a", "b", "c"], 4, 10, "t"))
    assert len(timings) == 10 and peak == 4 and wall_s >= 0.02
    assert seen[:4] == [("t-0", "a"), ("t-1", "b"), ("t-2", "c"), ("t-3", "a")]


def test_engine_side_measures_the_engine_step():
    async def go():
        engine = FakeEngine("m", 512, token_delay_s=0.01, accept_per_step=1)
        await engine.start()
        one = engine_request_fn(engine, "m", 6)
        return await one("r", "one two three four five six seven eight")

    timing = asyncio.run(go())
    assert timing.output_tokens == 6 and timing.prompt_tokens == 9
    assert 9.5 <= timing.tpot_ms <= 30 and timing.ttft_ms >= 9.5


def _ingress_over_http(spec, factory, plan, start_timeout_s):
    """The platform phase without Ray: the same ingress app on uvicorn, LocalBackend."""
    import uvicorn
    from agentserve.serve.backend import LocalBackend
    from agentserve.serve.ingress import create_app

    model = spec.models[0]
    engine = factory(model)
    asyncio.run(engine.start())
    app = create_app(spec, {model.name: LocalBackend(engine)})
    config = uvicorn.Config(app, host="127.0.0.1", port=spec.server.port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        url = f"http://127.0.0.1:{spec.server.port}"
        return asyncio.run(http_levels(url, model.name, plan))
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_whole_command_on_the_fake_engine(tmp_path, capsys):
    (tmp_path / "benchmarks.md").write_text(DOC)
    argv = ["bench", "overhead", "--engine", "fake", "--concurrency", "1,4", "--max-tokens", "6"]
    args = build_parser().parse_args([*argv, "--fake-step-ms", "10", "--docs", str(tmp_path)])
    assert run(args, platform_runner=_ingress_over_http) == 0
    report = json.loads((tmp_path / "benchmarks" / "platform_overhead.json").read_text())
    assert report["command"] == " ".join(["agentserve", *argv, "--fake-step-ms", "10"])
    assert (report["engine"], report["max_tokens"], report["drafter"]) == ("fake", 6, None)
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 4]
    assert list(report["systems"]) == ["bare", "agentserve"] and report["reference"] == "bare"
    for lv in report["levels"]:
        bare, platform = lv["systems"]["bare"], lv["systems"]["agentserve"]
        assert all(lv["same_tokens"].values()) and bare["output_tokens"] == 6 * bare["requests"]
        assert bare["output_tokens"] == 48
        for side in (bare, platform):  # measured: each token waits one 10 ms engine step
            assert side["tpot_ms"] >= 9.5 and side["ttft_ms"] >= 9.5
            assert side["tokens_per_s"] == pytest.approx(
                side["output_tokens"] / side["wall_s"], rel=0.01
            )
        assert lv["tpot_ratio"]["agentserve"] == pytest.approx(
            platform["tpot_ms"] / bare["tpot_ms"], 1e-3
        )
        assert lv["throughput_ratio"]["agentserve"] == pytest.approx(
            platform["tokens_per_s"] / bare["tokens_per_s"], 1e-3
        )
    assert set(report["target"]["throughput_scaling"]) == {"1", "4"}
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "Intro stays." in doc and "\nold\n" not in doc
    assert "## Platform overhead" in doc and "| 4 |" in doc
    assert "| concurrency | system | tok/s | tok/s vs bare |" in capsys.readouterr().out


def test_plan_requests_per_level():
    plan = Plan(("p",), (1, 4, 16), 8)
    assert [plan.requests(c) for c in plan.concurrency] == [8, 8, 32]


def test_bare_vllm_prompt_is_the_rendered_chat_template():
    from agentserve_bench.overhead_requests import prompt_ids

    class Tokenizer:
        def apply_chat_template(self, messages, *, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return f"<user>{messages[0]['content']}</user><assistant>"

        def encode(self, text, *, add_special_tokens):
            assert not add_special_tokens  # the template already has its special tokens
            return [len(w) for w in text.split("><")]

    assert prompt_ids(Tokenizer(), "hi") == [14, 10]  # "<user>hi</user", "assistant>"


@pytest.mark.parametrize(
    ("flags", "drafting"), [([], True), (["--no-drafter"], False), (["--drafter"], True)]
)
def test_bench_spec_drafter_default_as_up(flags, drafting):
    from agentserve.drafters import shipped_drafter
    from agentserve_bench.overhead import bench_spec

    if shipped_drafter("smollm2-135m-instruct") is None:
        pytest.skip("no shipped drafter installed")
    spec = bench_spec(build_parser().parse_args(["bench", "overhead", *flags]))
    model = spec.models[0]
    assert model.drafter.enabled is drafting and model.engine == "vllm"
    assert model.max_num_seqs == 16 and spec.server.port != 8000


def test_systems_to_run_in_order_and_bad_choices_are_clear():
    from agentserve_bench.overhead import systems_to_run

    def args(*flags):
        return build_parser().parse_args(["bench", "overhead", *flags])

    assert systems_to_run(args()) == (("bare", "vllm_serve", "ray_serve_llm", "agentserve"), None)
    assert systems_to_run(args("--engine", "fake")) == (("bare", "agentserve"), None)
    assert systems_to_run(args("--systems", "agentserve,vllm_serve")) == (
        ("vllm_serve", "agentserve"),
        None,
    )
    with pytest.raises(SystemExit, match="unknown"):
        systems_to_run(args("--systems", "bare,tgi"))
    with pytest.raises(SystemExit, match="needs --engine vllm"):
        systems_to_run(args("--engine", "fake", "--systems", "vllm_serve"))
    with pytest.raises(SystemExit, match="ray_serve_llm needs --engine vllm"):
        systems_to_run(args("--engine", "fake", "--systems", "ray_serve_llm"))


def test_ray_serve_llm_is_skipped_by_default_with_the_reason_and_refused_when_asked():
    from agentserve_bench.overhead import systems_to_run

    def args(*flags):
        return build_parser().parse_args(["bench", "overhead", *flags])

    why = "needs pyarrow in /x: run `python -m agentserve_bench.rayllm_env --install`"
    systems, skipped = systems_to_run(args(), why)
    assert systems == ("bare", "vllm_serve", "agentserve")
    assert skipped == f"ray_serve_llm skipped: {why}"
    assert systems_to_run(args("--systems", "bare,agentserve"), why) == (
        ("bare", "agentserve"),
        None,
    )
    with pytest.raises(SystemExit, match="ray_serve_llm: needs pyarrow"):
        systems_to_run(args("--systems", "ray_serve_llm,vllm_serve"), why)


def test_vllm_serve_gets_the_replica_engine_arguments_as_flags_vllm_accepts():
    """The flags parse with vLLM's own `vllm serve` parser into the replica's values."""
    pytest.importorskip("vllm")
    from agentserve.spec import ModelSpec
    from agentserve_bench.overhead_peers import serve_args
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    model = ModelSpec.model_validate(
        {
            "name": "m",
            "max_model_len": 1024,
            "max_num_seqs": 16,
            "enable_prefix_caching": False,
            "drafter": {"enabled": True, "method": "ngram", "num_speculative_tokens": 3},
        }
    )
    argv = serve_args(model, "/models/m", 8123)
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    assert (parsed.model, parsed.served_model_name, parsed.port) == ("/models/m", ["m"], 8123)
    assert (parsed.max_model_len, parsed.max_num_seqs, parsed.dtype) == (1024, 16, "bfloat16")
    assert parsed.enable_prefix_caching is False
    spec_config = parsed.speculative_config
    spec_config = json.loads(spec_config) if isinstance(spec_config, str) else spec_config
    assert spec_config["method"] == "ngram" and spec_config["num_speculative_tokens"] == 3

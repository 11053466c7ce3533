"""agentserve_bench/stream_interval.py: the two-model spec and the paired summary."""

from agentserve.spec import DeploymentSpec
from agentserve_bench.stream_interval import (
    TOKENS,
    section,
    summarize,
    tokens_section,
    two_model_spec,
)


def test_the_two_models_differ_only_in_their_cap():
    base = DeploymentSpec.model_validate({"models": [{"name": "m", "engine": "fake"}]})
    spec, names = two_model_spec(base, (100.0, 400.0))
    assert names == ["m-cap100", "m-cap400"]
    a, b = spec.models
    assert (a.name, b.name) == tuple(names)
    assert (a.stream_interval_max_ms, b.stream_interval_max_ms) == (100.0, 400.0)
    assert a.replicas.min_replicas == a.replicas.max_replicas == 1
    skip = {"name", "stream_interval_max_ms"}
    assert a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def _row(i: int, cap: float, c: int, decode: float, total: float, ttft: float) -> dict:
    return {"kind": "level", "round": i, "cap_ms": cap, "concurrency": c,
            "decode_tokens_per_s": decode, "throughput_tokens_per_s": total,
            "ttft_ms_p50": ttft}  # fmt: skip


def test_summary_pairs_rounds_per_concurrency():
    rows = [
        _row(0, 100, 4, 16.0, 50.0, 200.0), _row(0, 400, 4, 20.0, 60.0, 200.0),
        _row(1, 400, 4, 12.0, 40.0, 300.0), _row(1, 100, 4, 12.0, 44.0, 250.0),  # slower minute
        _row(2, 100, 4, 10.0, 30.0, 100.0), _row(2, 400, 4, 11.0, 33.0, 100.0),
        _row(3, 100, 4, 99.0, 99.0, 9.0),  # unpaired: left out
        _row(0, 100, 1, 30.0, 30.0, 90.0), _row(0, 400, 1, 30.0, 30.0, 90.0),
    ]  # fmt: skip
    one, four = summarize(rows, (100.0, 400.0))
    assert (one["concurrency"], one["rounds"], one["decode_tokens_per_s_ratio_median"]) == (1, 1, 1)
    assert four["rounds"] == 3
    assert four["decode_tokens_per_s"] == [12.0, 12.0]
    assert four["decode_tokens_per_s_ratio_median"] == 1.1  # 1.25, 1.0, 1.1
    assert four["decode_tokens_per_s_higher_in_rounds"] == 2
    assert four["throughput_tokens_per_s_ratio_median"] == 1.1  # 1.2, 0.909, 1.1
    assert four["ttft_ms_p50_ratio_median"] == 1.0
    table = section([{**s, "machine": {"cpu_class": "amx"}, "command": "cmd", "date": "d"}
                     for s in (one, four)])  # fmt: skip
    assert "| amx | 4 | 100 / 400 | 3 | 12.0 / 12.0 | 1.1x (2) |" in table
    assert "`cmd`" in table


def test_the_c1_ratio_is_the_control_the_others_are_read_against():
    """The cap does not act on one stream: what c=1 shows between the two replicas is
    their own difference, taken out of the higher concurrency's ratio."""
    rows = [
        _row(0, 100, 1, 30.0, 30.0, 90.0), _row(0, 400, 1, 33.0, 33.0, 90.0),  # replica bias
        _row(0, 100, 4, 20.0, 60.0, 90.0), _row(0, 400, 4, 22.0, 72.0, 90.0),
    ]  # fmt: skip
    summaries = summarize(rows, (100.0, 400.0))
    text = section([{**s, "machine": {"cpu_class": "amx"}} for s in summaries])
    assert "- `amx` c=4: decode 1.000x, throughput 1.091x" in text


def test_tokens_compare_the_engines_stream_interval_in_their_own_table():
    base = DeploymentSpec.model_validate({"models": [{"name": "m", "engine": "fake"}]})
    spec, names = two_model_spec(base, (1, 8), TOKENS)
    assert names == ["m-tokens1", "m-tokens8"]
    a, b = spec.models
    assert (a.stream_interval_tokens, b.stream_interval_tokens) == (1, 8)
    skip = {"name", "stream_interval_tokens"}
    assert a.model_dump(exclude=skip) == b.model_dump(exclude=skip)
    rows = [
        {"kind": "level", "round": 0, "tokens": t, "concurrency": 1, "decode_tokens_per_s": d,
         "throughput_tokens_per_s": d, "ttft_ms_p50": 60.0}
        for t, d in ((1, 90.0), (8, 99.0))
    ]  # fmt: skip
    (one,) = summarize(rows, (1, 8), TOKENS)
    assert one["stream_tokens"] == [1, 8] and one["decode_tokens_per_s_ratio_median"] == 1.1
    text = tokens_section([{**one, "machine": {"cpu_class": "amx"}}])
    assert "| CPU | c | tokens |" in text
    assert "| amx | 1 | 1 / 8 | 1 | 90.0 / 99.0 | 1.1x (1) |" in text
    assert "Net of the control" not in text  # the token interval acts at c=1 too

"""The sampling-distribution check's statistics: chi-square homogeneity, positions."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from agentserve_bench.sampling_check import (
    homogeneity_chi2,
    parse_setting,
    position_p_value,
    setting_label,
)


def _draw(weights: dict[str, float], n: int, seed: int) -> Counter:
    rng = random.Random(seed)
    return Counter(rng.choices(list(weights), list(weights.values()), k=n))


def test_same_distribution_is_not_rejected():
    w = {"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}
    p_values = [homogeneity_chi2(_draw(w, 2000, s), _draw(w, 2000, 100 + s))[2] for s in range(40)]
    # under the null, p is uniform: about 1 in 20 falls under 0.05, never most of them
    assert sum(p < 0.05 for p in p_values) <= 8
    assert min(p_values) > 1e-4


def test_different_distributions_are_rejected():
    a = _draw({"a": 0.5, "b": 0.3, "c": 0.2}, 2000, 1)
    b = _draw({"a": 0.4, "b": 0.3, "c": 0.3}, 2000, 2)
    stat, df, p = homogeneity_chi2(a, b)
    assert df == 2 and stat > 30 and p < 1e-6


def test_rare_categories_are_pooled():
    a = Counter({"x": 500, "r1": 1, "r2": 2})
    b = Counter({"x": 497, "r3": 3})
    _, df, p = homogeneity_chi2(a, b)
    assert df == 1  # x, and one "other" cell for r1..r3
    assert p > 0.5


def test_one_cell_only_gives_p_one():
    assert homogeneity_chi2(Counter({"x": 10}), Counter({"x": 12})) == (0.0, 0, 1.0)
    with pytest.raises(ValueError):
        homogeneity_chi2(Counter(), Counter({"x": 1}))


def test_position_p_value_separates_prompts_and_positions():
    rng = random.Random(0)
    prompt_of = [i % 2 for i in range(1200)]
    plain = [[p, rng.choice([1, 2, 3]), rng.choice([4, 5])] for p in prompt_of]
    same = [[p, rng.choice([1, 2, 3]), rng.choice([4, 5])] for p in prompt_of]
    combined, per_position = position_p_value(same, plain, prompt_of)
    assert len(per_position) == 3 and combined > 0.01
    corrupted = [[p, rng.choice([1, 2, 3]), 4] for p in prompt_of]  # position 3 collapsed
    combined, per_position = position_p_value(corrupted, plain, prompt_of)
    assert per_position[2] < 1e-10 and combined < 1e-9


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("0.7", {"temperature": 0.7}),
        ("1/0.9", {"temperature": 1.0, "top_p": 0.9}),
        ("1.0/0.9/20", {"temperature": 1.0, "top_p": 0.9, "top_k": 20}),
    ],
)
def test_sampling_settings_read_and_label(text, setting):
    assert parse_setting(text) == setting
    assert parse_setting(setting_label(setting)) == setting


@pytest.mark.parametrize("text", ["0", "-1", "1/", "1/0.9/20/3", "hot"])
def test_bad_sampling_settings_are_refused(text):
    with pytest.raises(ValueError):
        parse_setting(text)


def test_bench_sampling_command_reads_its_settings(capsys):
    from agentserve.cli import build_parser, main

    args = build_parser().parse_args(["bench", "sampling", "--settings", "0.5,1/0.9/20"])
    assert args.settings == [{"temperature": 0.5}, {"temperature": 1.0, "top_p": 0.9, "top_k": 20}]
    assert args.samples == 200 and not args.eager and args.dtype == "bfloat16"
    assert build_parser().parse_args(["bench", "sampling", "--dtype", "float32"]).dtype == "float32"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "sampling", "--settings", "0"])
    assert exit_info.value.code == 2
    assert "the temperature must be > 0" in capsys.readouterr().err


def test_bench_sampling_keeps_its_samples_for_a_rerun(tmp_path, monkeypatch):
    from agentserve.cli import build_parser
    from agentserve_bench import sampling

    calls = []

    def fake_runs(*args):
        calls.append(args)
        return {"none": {"0.7": {"outputs": [[1, 2]]}}}

    monkeypatch.setattr(sampling, "sampling_runs", fake_runs)
    argv = ["bench", "sampling", "--eager", "--work", str(tmp_path), "--settings", "0.7"]
    args = build_parser().parse_args(argv)
    first = sampling._cached_runs(args, "/m", {"none": None}, [[5, 6]], {"enforce_eager": True})
    again = sampling._cached_runs(args, "/m", {"none": None}, [[5, 6]], {"enforce_eager": True})
    assert first == again and len(calls) == 1 and calls[0][-1] == {"enforce_eager": True}
    sampling._cached_runs(args, "/m", {"none": None}, [[5, 7]], None)  # other prompts: resample
    assert len(calls) == 2
    float32 = {"enforce_eager": True, "dtype": "float32"}  # another dtype: resample
    sampling._cached_runs(args, "/m", {"none": None}, [[5, 6]], float32)
    assert len(calls) == 3 and calls[-1][-1] == float32

"""`agentserve bench speculative-served`: the served records, their ratios, the default rule,
the counters read from /metrics and the written figures (pure parts; the real run is in
tests/integration/test_bench_served_real.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentserve_bench.served_client import Reply, level_figures, parse_spec_counters
from agentserve_bench.served_report import write_served
from agentserve_bench.served_rows import fill_ratios, row, served_default, settings_scores
from agentserve_bench.settings_bundles import default_settings
from agentserve_bench.speculative_served import parse_methods, run_order

MACHINE = {"model": "AMD EPYC", "cores": 2, "features": ["avx2"], "cpu_class": "avx2"}


def _row(method, workload, c, tps, server="agentserve", k=4, texts=("a", "b"), drafts=0, acc=0):
    figures = {"decode_tokens_per_s": tps, "throughput_tokens_per_s": tps * c,
               "ttft_ms_p50": 100.0, "requests": 2, "output_tokens": 10, "wall_s": 1.0}  # fmt: skip
    counters = {"drafts": drafts, "draft_tokens": drafts * k, "accepted_tokens": acc}
    return row(server=server, method=method, k=0 if method == "none" else k, workload=workload,
               concurrency=c, figures=figures, counters=counters, machine=MACHINE,
               dtype="bfloat16", engine_env={}, texts=list(texts),
               settings=default_settings(MACHINE["cpu_class"]))  # fmt: skip


def _grid(speedups: dict[str, dict[tuple[str, int], float]]) -> list[dict]:
    rows = []
    for w in ("coding", "agent"):
        for c in (1, 4):
            rows.append(_row("none", w, c, 20.0))
            for method, by_cell in speedups.items():
                rows.append(_row(method, w, c, 20.0 * by_cell[(w, c)]))
    return rows


def _all(x: float) -> dict[tuple[str, int], float]:
    return {(w, c): x for w in ("coding", "agent") for c in (1, 4)}


@pytest.mark.parametrize(
    ("speedups", "want"),
    [
        ({"ngram": _all(0.77), "dflash": _all(0.48)}, "none"),  # nothing pays: plain
        ({"ngram": _all(1.3), "dflash": _all(1.5)}, "dflash"),
        # fastest on average but slower under load: not the default
        ({"ngram": _all(1.2), "dflash": {**_all(2.0), ("agent", 4): 0.9}}, "ngram"),
        # a c=1 gain within noise does not make a default
        ({"ngram": _all(1.03)}, "none"),
        ({"ngram": {**_all(1.2), ("coding", 1): 1.02}}, "none"),
    ],
)
def test_served_default_rule(speedups, want):
    records = fill_ratios(_grid(speedups), None)
    assert served_default(records)[0] == want


def test_only_agentserve_rows_decide_the_default():
    rows = _grid({"ngram": _all(0.8)})
    rows += [
        _row("none", w, c, 10.0, server="vllm_serve") for w in ("coding", "agent") for c in (1, 4)
    ]
    rows += [
        _row("ngram", w, c, 30.0, server="vllm_serve") for w in ("coding", "agent") for c in (1, 4)
    ]
    assert served_default(fill_ratios(rows, None))[0] == "none"


def test_ratios_identity_tau_and_default_flag():
    rows = [
        _row("none", "coding", 1, 20.0, texts=("x", "y")),
        _row("ngram", "coding", 1, 30.0, texts=("x", "z"), drafts=10, acc=15),
        _row("none", "coding", 1, 25.0, server="vllm_serve"),
    ]
    out = fill_ratios(rows, "ngram")
    ngram = out[1]
    assert ngram["speedup_vs_plain"] == 1.5 and ngram["greedy_identical"] == "1/2"
    assert ngram["tau"] == 2.5 and ngram["acceptance_rate"] == 0.375
    assert [r["default"] for r in out] == [False, True, False]
    assert out[2]["speedup_vs_plain"] == 1.0  # vs its own server's plain row
    assert out[0]["tau"] == 1.0


def test_a_method_measured_at_two_ks_is_the_default_at_its_best_k_only():
    rows = []
    for w in ("coding", "agent"):
        for c in (1, 4):
            rows += [_row("none", w, c, 20.0), _row("ngram", w, c, 30.0, k=4)]
            rows.append(_row("ngram", w, c, 36.0 if c == 1 else 29.0, k=8))
    default, scores = served_default(fill_ratios(rows, None))
    assert (default, scores["ngram"]["k"]) == ("ngram", 8)  # geometric mean 1.62 vs 1.5
    out = fill_ratios(rows, default, scores[default]["k"])
    assert {r["num_speculative_tokens"] for r in out if r["default"]} == {8}
    assert sum(r["default"] for r in out) == 4


def test_methods_always_start_with_plain():
    assert parse_methods("ngram:4,dflash:3") == [("none", 0), ("ngram", 4), ("dflash", 3)]
    assert parse_methods("none,ngram") == [("none", 0), ("ngram", 4)]
    with pytest.raises(SystemExit, match="bad k"):
        parse_methods("ngram:x")


def test_each_peer_runs_right_after_agentserves_run_of_its_method():
    methods = parse_methods("ngram:4,dflash:3")
    assert run_order(methods, [("none", 0)]) == [
        ("agentserve", "none", 0),
        ("vllm_serve", "none", 0),
        ("agentserve", "ngram", 4),
        ("agentserve", "dflash", 3),
    ]
    # a peer method agentserve does not run (or runs with another k) comes last
    assert run_order(methods, [("ngram", 4), ("ngram", 7)]) == [
        ("agentserve", "none", 0),
        ("agentserve", "ngram", 4),
        ("vllm_serve", "ngram", 4),
        ("agentserve", "dflash", 3),
        ("vllm_serve", "ngram", 7),
    ]
    assert run_order(methods, []) == [("agentserve", m, k) for m, k in methods]


def test_counters_from_both_servers_metrics():
    vllm = (
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 48.0\n'
    )
    ours = (
        'agentserve_spec_decode_drafts_total{model="a"} 3\n'
        'agentserve_spec_decode_drafts_total{model="b"} 4\n'
        'agentserve_spec_decode_accepted_tokens_total{model="a"} 5\n'
        'agentserve_spec_decode_acceptance_length{model="a"} 2.5\n'
    )
    assert parse_spec_counters(vllm) == {"drafts": 12, "draft_tokens": 48, "accepted_tokens": 30}
    assert parse_spec_counters(ours) == {"drafts": 7, "draft_tokens": 0, "accepted_tokens": 5}


def test_hybrid_rows_split_acceptance_by_proposer():
    page = (
        'agentserve_spec_decode_drafts_total{model="m"} 10\n'
        'agentserve_spec_decode_accepted_tokens_total{model="m"} 14\n'
        'agentserve_spec_decode_proposer_drafts_total{model="m",proposer="ngram"} 6\n'
        'agentserve_spec_decode_proposer_accepted_tokens_total{model="m",proposer="ngram"} 12\n'
        'agentserve_spec_decode_proposer_drafts_total{model="m",proposer="dflash"} 4\n'
        'agentserve_spec_decode_proposer_accepted_tokens_total{model="m",proposer="dflash"} 2\n'
        'agentserve_spec_decode_hybrid_steps_total{kind="block",model="m"} 5\n'
        'agentserve_spec_decode_hybrid_steps_total{model="m",kind="context_only"} 3\n'
    )
    counters = parse_spec_counters(page)
    assert counters["steps_block"] == 5 and counters["steps_context_only"] == 3
    assert counters["ngram.drafts"] == 6 and counters["dflash.accepted_tokens"] == 2
    figures = {"decode_tokens_per_s": 9.0, "throughput_tokens_per_s": 9.0, "ttft_ms_p50": 1.0}
    r = row(server="agentserve", method="hybrid", k=4, workload="coding", concurrency=1,
            figures=figures, counters=counters, machine=MACHINE, dtype="bfloat16",
            engine_env={}, texts=["a"])  # fmt: skip
    assert r["tau"] == 2.4
    assert r["proposers"] == {
        "dflash": {"drafts": 4, "share": 0.4, "tau": 1.5},
        "ngram": {"drafts": 6, "share": 0.6, "tau": 3.0},
    }  # the step kinds are not taken for proposers
    assert r["context_only_steps"] == 0.375  # 3 of 8 steps without DFlash's block forward
    plain = _row("ngram", "coding", 1, 9.0, drafts=3, acc=3)
    assert "proposers" not in plain and "context_only_steps" not in plain


def test_level_figures_use_the_callers_clock():
    replies = [
        Reply(0.0, 0.5, 2.5, 21, "t"),
        Reply(0.0, 0.3, 1.3, 11, "u"),
        Reply(0.0, None, None, 0, ""),
    ]
    f = level_figures(replies, wall_s=4.0)
    assert f["decode_tokens_per_s"] == 10.0 and f["ttft_ms_p50"] == 400.0
    assert f["throughput_tokens_per_s"] == 8.0 and f["requests"] == 3


def test_written_rows_replace_only_served_rows_and_lead_the_doc(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    old = [{"path": "offline", "method": "none"}, {"test": "sampling"}, {"path": "served", "x": 1}]
    (tmp_path / "benchmarks" / "speculative.json").write_text(json.dumps(old))
    (tmp_path / "benchmarks.md").write_text(
        "# Benchmarks\n\nintro\n\n<!-- speculative:begin -->\nold\n<!-- speculative:end -->\n"
    )
    records = fill_ratios(_grid({"ngram": _all(0.8)}), "none")
    default, scores = served_default(records)
    write_served(records, scores, default, tmp_path, command="agentserve bench x", wall_s=1.0,
                 machine=MACHINE)  # fmt: skip
    saved = json.loads((tmp_path / "benchmarks" / "speculative.json").read_text())
    assert saved[:2] == old[:2] and len(saved) == 2 + len(records)
    assert all("texts" not in r and len(r["text_digests"]) == 2 for r in saved[2:])
    doc = (tmp_path / "benchmarks.md").read_text()
    assert doc.index("speculative-served:begin") < doc.index("speculative:begin")
    assert "- `avx2`: ngram:4 0.80x (fails the bar). **Default: none.**" in doc


def test_the_report_compares_plain_with_vllm_and_drafters_with_ngram(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    rows = _grid({"ngram": _all(2.0), "hybrid": _all(2.2), "dflash": _all(1.0)})
    rows += [_row("none", w, c, 25.0, server="vllm_serve") for w in ("coding", "agent")
             for c in (1, 4)]  # fmt: skip
    records = fill_ratios(rows, "none")
    default, scores = served_default(records)
    write_served(records, scores, default, tmp_path, command="x", wall_s=1.0, machine=MACHINE)
    doc = (tmp_path / "benchmarks.md").read_text()
    assert (
        "Plain agentserve vs plain vLLM server (decode tok/s at c=1, aggregate above): "
        "avx2 agent c=1: 0.80x" in doc
    )
    line = next(x for x in doc.splitlines() if x.startswith("DFlash and hybrid vs n-gram"))
    assert "avx2 hybrid coding c=1: 1.10x" in line and "avx2 dflash agent c=4: 0.50x" in line
    assert line.count("x,") == 7  # 2 methods x 2 workloads x 2 concurrencies


def test_each_settings_variant_is_compared_with_its_own_plain_and_never_decides():
    rows = _grid({"ngram": _all(0.9)})
    for r in _grid({"ngram": _all(2.0)}):
        rows.append({**r, "settings": "default/float32"})
    out = fill_ratios(rows, None)
    variant = [r for r in out if r["settings"] == "default/float32" and r["method"] == "ngram"]
    assert {r["speedup_vs_plain"] for r in variant} == {2.0}  # vs float32 plain, not bf16
    assert served_default(out)[0] == "none"  # the default settings' rows decide
    assert not any(r["default"] for r in variant)


def test_settings_are_scored_by_the_reply_time_of_their_own_best_method():
    rows = []
    for name, plain, ngram, ttft in (
        ("all-iomp", 20.0, 26.0, 2000.0),
        ("reserve-iomp", 17.0, 20.0, 3800.0),
    ):
        for r in _grid({"ngram": {k: ngram / plain for k in _all(1.0)}}):
            scaled = r["decode_tokens_per_s"] * plain / 20.0
            rows.append({**r, "settings": name, "decode_tokens_per_s": scaled, "ttft_ms_p50": ttft,
                         "command": "same"})  # fmt: skip
    scores = settings_scores(fill_ratios(rows, None))
    assert scores["all-iomp"]["method"] == "ngram" == scores["reserve-iomp"]["method"]
    # 2.0 s + 4 tokens at 26 tok/s, against 3.8 s + 4 at 20
    assert scores["all-iomp"]["reply_s"] == pytest.approx(2.0 + 4 / 26.0, abs=0.01)
    assert scores["all-iomp"]["reply_s"] < scores["reserve-iomp"]["reply_s"]


def test_engine_defaults_are_the_named_default_settings():
    from agentserve import profiles, ray_env
    from agentserve.engine import cpu_settings
    from agentserve.engine.cpu_settings import engine_environment
    from agentserve_bench.settings_bundles import SETTINGS

    iomp = Path("/venv/lib/libiomp5.so")
    named = engine_environment(SETTINGS[default_settings()], cores=[0, 1], iomp=iomp)
    assert engine_environment({}, cores=[0, 1], iomp=iomp) == named
    kinds = [p.stem for p in profiles.PROFILE_DIR.glob("*.json") if p.stem != profiles.POOLED]
    for cpu_class in [*kinds, "other"]:  # each kind's own bundle
        executor = SETTINGS[default_settings(cpu_class)]["AGENTSERVE_CPU_EXECUTOR"]
        assert executor == cpu_settings.cpu_executor({}, cpu_class)
    for cpu_class in [*kinds, "other"]:
        bundle = SETTINGS[default_settings(cpu_class)]
        assert bundle["AGENTSERVE_RAY_ENV"] == ray_env.ray_env_name({}, cpu_class)
        chosen = ray_env.RAY_ENVS[bundle["AGENTSERVE_RAY_ENV"]]
        assert {k: bundle[k] for k in chosen} == chosen  # the row's label means what ran


def test_ratios_and_defaults_never_cross_kinds_of_cpu():
    """Two machines' rows in one file: each method's ratio is to its own machine's plain
    decoding, and each machine's default comes from its own rows."""
    from agentserve_bench.served_rows import by_machine, fill_ratios, served_default

    def r(cpu: str, method: str, workload: str, c: int, tok_s: float) -> dict:
        return {
            "path": "served", "server": "agentserve", "settings": default_settings(cpu),
            "method": method,
            "num_speculative_tokens": 0 if method == "none" else 4, "workload": workload,
            "concurrency": c, "decode_tokens_per_s": tok_s, "throughput_tokens_per_s": tok_s,
            "texts": ["x"], "machine": {"cpu_class": cpu},
        }  # fmt: skip

    rows = []
    for w in ("coding", "agent"):
        for c in (1, 4):
            rows += [r("avx2", "none", w, c, 20.0), r("avx2", "ngram", w, c, 15.0)]
            rows += [r("amx", "none", w, c, 30.0), r("amx", "ngram", w, c, 45.0)]
    filled = fill_ratios(rows, None)
    assert {x["speedup_vs_plain"] for x in filled if x["method"] == "ngram"} == {0.75, 1.5}
    groups = by_machine(filled)
    assert served_default(groups["amx"])[0] == "ngram"
    assert served_default(groups["avx2"])[0] == "none"


def test_a_candidate_drafter_serves_the_dflash_and_hybrid_rows_only(tmp_path):
    from agentserve.drafters import BUNDLED_DRAFTER_DIR
    from agentserve_bench.speculative_served import bench_spec

    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "config.json").write_text((BUNDLED_DRAFTER_DIR / "config.json").read_text())
    for method, k in (("dflash", 3), ("hybrid", 4)):
        spec = bench_spec(method, k, 8719, 4, None, drafter=str(candidate))
        assert spec.models[0].drafter.path == str(candidate.resolve())
    assert (
        bench_spec("ngram", 4, 8719, 4, None, drafter=str(candidate)).models[0].drafter.path is None
    )
    shipped = bench_spec("dflash", 3, 8719, 4, None).models[0].drafter
    assert shipped.path != str(candidate.resolve())
    # schedule off: k drafts at every batch, where `up`'s schedule may turn drafting off
    auto = bench_spec("hybrid", 4, 8719, 4, None).models[0].drafter
    off = bench_spec("hybrid", 4, 8719, 4, None, schedule="off").models[0].drafter
    assert auto.num_speculative_tokens_per_batch_size is not None
    assert off.num_speculative_tokens_per_batch_size is None and off.num_speculative_tokens == 4


def test_a_speculative_row_records_the_schedule_it_ran_with():
    """What each batch size drafted is part of the measurement (the row's k is only the
    most): the fits and the projections checked against served rows read it."""
    schedule = [[1, 1, 8], [2, 8, 2]]
    common = dict(workload="coding", concurrency=1, counters={}, machine=MACHINE,
                  dtype="float32", engine_env={}, texts=["a"], schedule=schedule,
                  figures={"decode_tokens_per_s": 1.0})  # fmt: skip
    assert row(server="agentserve", method="ngram", k=8, **common)["schedule"] == schedule
    assert "schedule" not in row(server="agentserve", method="none", k=0, **common)
    no_schedule = {**common, "schedule": None}
    assert "schedule" not in row(server="agentserve", method="ngram", k=8, **no_schedule)


def test_a_variant_run_keeping_other_rows_leaves_the_default_to_all_of_them(tmp_path, monkeypatch):
    """A run of a variant only (here schedule off), with --keep-other-rows, decides nothing
    by itself: the default, its flags and the section come from every row of the kind of
    CPU, the kept default-settings rows included (it said "Default: none" before)."""
    import argparse

    from agentserve.engine.cpu_info import read_cpu_info
    from agentserve_bench import speculative_served

    machine = read_cpu_info().as_dict()
    settings = default_settings(machine["cpu_class"])  # the rows that decide on this CPU
    kept = [{**r, "machine": machine, "settings": settings, "date": "2026-01-01",
             "command": "kept"}
            for r in fill_ratios(_grid({"ngram": _all(2.0)}), "ngram", 4)]  # fmt: skip
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "speculative.json").write_text(json.dumps(kept))
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n")

    def measure(server, method, k, spec, args, conversations, machine_, settings, logs):
        rows = [_row(method, w, c, 30.0 if method == "none" else 90.0, k=k)
                for w in ("coding", "agent") for c in (1, 4)]  # fmt: skip
        return [{**r, "settings": settings, "machine": machine_} for r in rows]

    monkeypatch.setattr(speculative_served, "_measure", measure)
    # the held-out conversations take ~20 s per workload to build; measure reads none
    monkeypatch.setattr(speculative_served, "workload_messages", lambda workload, n, half=None: [])
    parser = argparse.ArgumentParser()
    speculative_served.add_parser(parser.add_subparsers())
    args = parser.parse_args(["speculative-served", "--methods", "ngram:8", "--schedule", "off",
                              "--peer-methods", "", "--keep-other-rows", "--engine", "fake",
                              "--num-prompts", "1", "--docs", str(tmp_path)])  # fmt: skip
    assert speculative_served.run(args) == 0
    saved = json.loads((tmp_path / "benchmarks" / "speculative.json").read_text())
    off = [r for r in saved if r["settings"].endswith("schedule-off")]
    assert len(off) == 8 and not any(r.get("default") for r in off)
    assert sum(1 for r in saved if r.get("default")) == 4  # the kept ngram rows still
    doc = (tmp_path / "benchmarks.md").read_text()
    assert f"- `{machine['cpu_class']}`: ngram:4 2.00x. **Default: ngram.**" in doc


def test_the_report_compares_each_method_with_vllm_running_the_same_config(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    rows = _grid({"ngram": _all(2.0)})
    peer = [_row("ngram", w, c, 32.0, server="vllm_serve") for w in ("coding", "agent")
            for c in (1, 4)]  # fmt: skip
    records = fill_ratios(rows + peer, "ngram")
    default, scores = served_default(records)
    write_served(records, scores, default, tmp_path, command="x", wall_s=1.0, machine=MACHINE)
    doc = (tmp_path / "benchmarks.md").read_text()
    line = next(x for x in doc.splitlines() if x.startswith("Speculation: agentserve vs vLLM"))
    assert "avx2 agent c=1: 1.25x" in line and line.count("x,") == 3


def test_sampled_rows_pair_with_plain_at_their_temperature_and_never_decide(tmp_path):
    def at(r, t):
        return {**r, "temperature": t}

    rows = _grid({"ngram": _all(1.5)})
    rows += [at(_row("none", w, c, 10.0), 0.7) for w in ("coding", "agent") for c in (1, 4)]
    rows += [
        at(_row("dflash", w, c, 40.0, texts=("q", "r")), 0.7)
        for w in ("coding", "agent")
        for c in (1, 4)
    ]
    out = fill_ratios(rows, None)
    sampled = [r for r in out if r["method"] == "dflash"]
    assert {r["speedup_vs_plain"] for r in sampled} == {4.0}  # vs plain at T=0.7, not T=0
    assert all("greedy_identical" not in r for r in sampled)  # sampled replies differ
    default, scores = served_default(out)
    assert default == "ngram" and "dflash" not in scores
    write_served(out, scores, default, tmp_path, command="x", wall_s=1.0, machine=MACHINE)
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "| 0.7 | 1 |" in doc and "| 0 | 1 |" in doc  # the T column


def test_the_served_bench_takes_temperatures():
    from agentserve.cli import build_parser

    args = build_parser().parse_args(["bench", "speculative-served", "--temperatures", "0,0.7"])
    assert args.temperatures == [0.0, 0.7]
    default = build_parser().parse_args(["bench", "speculative-served"])
    assert default.temperatures == [0.0]

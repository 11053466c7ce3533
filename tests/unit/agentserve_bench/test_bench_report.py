"""Benchmark bookkeeping: ratios, greedy identity, histograms, docs sections."""

from __future__ import annotations

from types import SimpleNamespace

from agentserve.engine.vllm_args import spec_decode_counters
from agentserve_bench.report import finalize, histogram_lines, markdown_table, replace_section
from agentserve_bench.speculative import histogram_from_positions


def _cell(method, tps, outputs, k=0, temperature=0.0, engine="vllm"):
    return {
        "engine": engine,
        "method": method,
        "num_speculative_tokens": k,
        "temperature": temperature,
        "batch_size": 1,
        "tokens_per_s": tps,
        "tau": 1.0,
        "per_position_acceptance": [],
        "outputs": outputs,
    }


def test_finalize_computes_speedup_and_greedy_identity():
    cells = [
        _cell("none", 10.0, [[1, 2]]),
        _cell("dflash", 35.0, [[1, 2]], k=7),
        _cell("ngram", 12.0, [[1, 3]], k=7),
        _cell("none", 9.0, [[5]], temperature=1.0),
        _cell("dflash", 18.0, [[6]], k=7, temperature=1.0),
    ]
    records = finalize(cells)
    assert [r["speedup_vs_no_spec"] for r in records] == [1.0, 3.5, 1.2, 1.0, 2.0]
    assert [r["outputs_identical"] for r in records] == [True, True, False, None, None]
    assert all("outputs" not in r for r in records)
    table = markdown_table(records)
    assert "3.50x" in table and "**NO**" in table


def test_histogram_from_prefix_acceptance_counts():
    # 10 drafts: 6 accepted >= 1 token, 3 accepted >= 2, 1 accepted all 3
    assert histogram_from_positions(10, [6, 3, 1]) == {1: 4, 2: 3, 3: 2, 4: 1}


def test_spec_decode_counters_reads_vllm_metric_names():
    metrics = [
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=4),
        SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=28),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=9),
        SimpleNamespace(
            name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[4, 3, 2, 0, 0, 0, 0]
        ),
        SimpleNamespace(name="vllm:num_requests_running", value=1),
    ]
    got = spec_decode_counters(metrics)
    assert got == {
        "drafts": 4,
        "draft_tokens": 28,
        "accepted_tokens": 9,
        "accepted_per_pos": [4, 3, 2, 0, 0, 0, 0],
    }


def test_replace_section_is_idempotent(tmp_path):
    doc = tmp_path / "benchmarks.md"
    replace_section(doc, "spec", "first")
    replace_section(doc, "other", "keep me")
    replace_section(doc, "spec", "second")
    text = doc.read_text()
    assert "second" in text and "first" not in text and "keep me" in text
    assert text.count("<!-- spec:begin -->") == 1


def test_histogram_lines_give_shares_per_speculative_cell():
    records = finalize(
        [
            _cell("none", 10.0, [[1]]),
            {**_cell("dflash", 20.0, [[1]], k=7), "tau_histogram": {"1": 3, "2": 1}},
        ]
    )
    text = histogram_lines(records)
    assert text.count("\n") == 1 and "dflash7" in text and "1: 75%, 2: 25%" in text


def test_greedy_divergence_is_located_and_batch_variance_of_plain_decoding_named():
    def cell(method, outputs, batch, k=0):
        return {**_cell(method, 10.0, outputs, k=k), "batch_size": batch}

    plain_b1, plain_b4 = [[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]
    records = finalize(
        [
            cell("none", plain_b1, 1),
            cell("none", plain_b4, 4),
            cell("dflash", plain_b4, 1, k=7),  # = plain decoding, but at batch 4
            cell("ngram", [[1, 7, 3], [4, 5]], 1, k=7),  # equals no plain run
        ]
    )
    assert [r["identical_to_plain_batch"] for r in records] == [[1], [4], [4], []]
    assert records[2]["divergence"] == {"prompts": 1, "first_token": 2}
    assert records[3]["divergence"] == {"prompts": 1, "first_token": 1}
    table = markdown_table(records)
    assert "(plain; differs from batch 4)" in table and "(plain; differs from batch 1)" in table
    assert "= plain at batch 4" in table and "**NO** (1 prompts, from token 1)" in table

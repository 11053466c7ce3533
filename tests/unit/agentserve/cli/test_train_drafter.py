"""`agentserve train-drafter` helpers that need no model."""

from __future__ import annotations

from agentserve.cli.train_drafter_data import _interleaved

from dflash.train.prompts import Prompt


def test_data_order_interleaves_prompt_kinds_and_keeps_each_kinds_order():
    prompts = [Prompt(f"m{i}", "math", "x") for i in range(3)]
    prompts += [Prompt("c0", "code", "x"), Prompt("c1", "code-edit", "x")]
    prompts += [Prompt("a0", "agent-summary", "x")]
    order = [p.id for p in _interleaved(prompts)]
    assert order == ["m0", "c0", "a0", "m1", "c1", "m2"]
    assert sorted(order) == sorted(p.id for p in prompts)


def test_a_fresh_work_dir_starts_from_the_committed_responses(tmp_path, capsys):
    import argparse
    import gzip
    import json

    from agentserve.cli.train_drafter_data import RESPONSES_ARCHIVE, restore_responses

    args = argparse.Namespace(model="smollm2-135m-instruct")
    restore_responses(args, tmp_path)
    restored = (tmp_path / "responses.jsonl").read_text().splitlines()
    with gzip.open(RESPONSES_ARCHIVE, "rt") as f:
        assert restored == f.read().splitlines()
    assert len(restored) > 1000 and all(json.loads(line)["prompt_ids"] for line in restored[:5])
    assert "restored" in capsys.readouterr().out
    (tmp_path / "responses.jsonl").write_text("")  # never overwrites an existing file
    restore_responses(args, tmp_path)
    assert (tmp_path / "responses.jsonl").read_text() == ""


def test_the_warm_start_note_says_when_a_drafter_was_grown(tmp_path):
    import argparse
    import json

    from agentserve.cli.train_drafter import _growth

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    assert _growth(tmp_path, argparse.Namespace(layers=3)) == ", grown from 2 to 3 layers"
    assert _growth(tmp_path, argparse.Namespace(layers=2)) == ""
    assert _growth(tmp_path / "absent", argparse.Namespace(layers=3)) == ""

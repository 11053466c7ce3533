"""Drafter training stages (dflash/train/), the helpers that need no model."""

from __future__ import annotations

import pytest

from dflash.train.data_stage import _interleaved
from dflash.train.prompts import Prompt


def test_data_order_interleaves_prompt_kinds_and_keeps_each_kinds_order():
    prompts = [Prompt(f"m{i}", "math", "x") for i in range(3)]
    prompts += [Prompt("c0", "code", "x"), Prompt("c1", "code-edit", "x")]
    prompts += [Prompt("a0", "agent-summary", "x")]
    order = [p.id for p in _interleaved(prompts)]
    assert order == ["m0", "c0", "a0", "m1", "c1", "m2"]
    assert sorted(order) == sorted(p.id for p in prompts)


def test_a_fresh_work_dir_starts_from_the_committed_responses(tmp_path, capsys):
    import gzip
    import json

    from dflash.train.data_stage import responses_archive, restore_responses

    archive = responses_archive("smollm2-135m-instruct")
    restore_responses(archive, tmp_path)
    restored = (tmp_path / "responses.jsonl").read_text().splitlines()
    with gzip.open(archive, "rt") as f:
        assert restored == f.read().splitlines()
    assert len(restored) > 1000 and all(json.loads(line)["prompt_ids"] for line in restored[:5])
    assert "restored" in capsys.readouterr().out
    (tmp_path / "responses.jsonl").write_text("")  # never overwrites an existing file
    restore_responses(archive, tmp_path)
    assert (tmp_path / "responses.jsonl").read_text() == ""


def test_the_warm_start_note_says_when_a_drafter_was_grown(tmp_path):
    import argparse
    import json

    from dflash.train.pipeline import _growth

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    assert _growth(tmp_path, argparse.Namespace(layers=3)) == ", grown from 2 to 3 layers"
    assert _growth(tmp_path, argparse.Namespace(layers=2)) == ""
    assert _growth(tmp_path / "absent", argparse.Namespace(layers=3)) == ""


def _fake_builders(monkeypatch, snippets):
    import dflash.train.data_stage as data
    from dflash.train.code_prompts import agent_prompts, code_prompts

    monkeypatch.setattr(data, "collect_snippets", lambda *a, **k: snippets)
    monkeypatch.setattr(data, "StdlibIndex", lambda: None)
    monkeypatch.setattr(data, "code_prompts", code_prompts)
    monkeypatch.setattr(data, "agent_prompts", agent_prompts)
    return data


def _snippets(n):
    from dflash.train.code_prompts import CodeSnippet

    body = "\n".join(f"    total = total + {i}" for i in range(6))
    return [
        CodeSnippet("pkg", f"pkg.mod{i}", f"f{i}", f"def f{i}(a, b):\n{body}\n    return total",
                    ("a", "b"), f"Add {i}.")
        for i in range(n)
    ]  # fmt: skip


def test_asking_for_more_context_prompts_keeps_the_old_ones_first(tmp_path, monkeypatch):
    from argparse import Namespace

    data = _fake_builders(monkeypatch, _snippets(40))
    path = tmp_path / "context_prompts.jsonl"
    small = data._context_prompts(Namespace(code_prompts=10, agent_prompts=5, seed=0), path)
    grown = data._context_prompts(Namespace(code_prompts=20, agent_prompts=8, seed=0), path)
    assert len(small) == 15 and len(grown) == 28
    assert set(small) <= set(grown)  # same ids, same texts: kept responses stay paired
    assert data._load_prompts(path) == grown
    # asking for fewer than held keeps the file as it is
    assert data._context_prompts(Namespace(code_prompts=5, agent_prompts=2, seed=0), path) == grown


def test_a_rebuild_that_changes_kept_prompts_is_refused(tmp_path, monkeypatch):
    from argparse import Namespace

    data = _fake_builders(monkeypatch, _snippets(40))
    path = tmp_path / "context_prompts.jsonl"
    data._context_prompts(Namespace(code_prompts=10, agent_prompts=5, seed=0), path)
    _fake_builders(monkeypatch, _snippets(40)[::-1])  # other installed code
    with pytest.raises(SystemExit, match="differ when rebuilt"):
        data._context_prompts(Namespace(code_prompts=20, agent_prompts=5, seed=0), path)

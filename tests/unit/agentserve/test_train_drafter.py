"""`agentserve train-drafter` helpers that need no model."""

from __future__ import annotations

from agentserve.train_drafter import _interleaved

from dflash.train.prompts import Prompt


def test_data_order_interleaves_prompt_kinds_and_keeps_each_kinds_order():
    prompts = [Prompt(f"m{i}", "math", "x") for i in range(3)]
    prompts += [Prompt("c0", "code", "x"), Prompt("c1", "code-edit", "x")]
    prompts += [Prompt("a0", "agent-summary", "x")]
    order = [p.id for p in _interleaved(prompts)]
    assert order == ["m0", "c0", "a0", "m1", "c1", "m2"]
    assert sorted(order) == sorted(p.id for p in prompts)

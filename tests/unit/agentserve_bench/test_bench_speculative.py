"""`agentserve bench speculative`: method configs are the ones `agentserve up` would use."""

from __future__ import annotations

import pytest
from agentserve_bench import command
from agentserve_bench.command import _methods
from agentserve_bench.speculative import method_speculative_config


def test_methods_build_the_served_speculative_config(drafter_dir):
    assert method_speculative_config("none", 0, "/models/m", None) is None
    dflash = method_speculative_config("dflash", 7, "/models/m", str(drafter_dir))
    assert dflash == {"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": 7}
    ngram = method_speculative_config("ngram", 5, "/models/m", None)
    assert ngram["method"] == "ngram" and ngram["prompt_lookup_min"] >= 1
    scheduled = method_speculative_config("dflash+schedule", 7, "/models/m", str(drafter_dir))
    schedule = scheduled["num_speculative_tokens_per_batch_size"]
    assert schedule[0][0] == 1 and all(0 <= k <= 7 for _, _, k in schedule)
    with pytest.raises(ValueError, match="exceeds"):
        method_speculative_config("dflash", 16, "/models/m", str(drafter_dir))


def test_method_list_parsing(monkeypatch):
    monkeypatch.setattr(command, "find_spec", lambda name: None)
    assert _methods("none,dflash:5,dflash+schedule,suffix:7,ngram") == [
        ("none", 0),
        ("dflash", 5),
        ("dflash+schedule", 7),
        ("ngram", 7),
    ]

"""Hybrid drafting: n-gram drafts where prompt lookup matches, DFlash's elsewhere; per-proposer
acceptance; the runner hook and the import hook that installs it. The engine itself runs
it in tests/integration/test_vllm_dflash.py (float32 greedy identity) and
tests/integration/test_vllm_sampling.py (T > 0 distribution)."""

from __future__ import annotations

import os
import sys
import time
from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pytest
from agentserve.speculation import hybrid_drafter as h

Taken = namedtuple("Taken", "req_ids draft_token_ids")  # vLLM's DraftTokenIds fields


class FakeNgram:
    """Matches where `found` says, as NgramProposer.propose would (one list per row)."""

    def __init__(self, found: dict[int, list[int]]):
        self.found, self.calls = found, []

    def propose(self, k, sampled, num_tokens, token_ids):
        self.calls.append((k, [bool(s) for s in sampled]))
        return [self.found.get(i, [])[:k] if s else [] for i, s in enumerate(sampled)]


def _hybrid(found, dflash_tokens=2, **kw):
    return h.HybridDrafts(FakeNgram(found), dflash_tokens=dflash_tokens, **kw)


def test_ngram_drafts_replace_dflash_where_lookup_matches_and_dflash_is_cut_elsewhere():
    hybrid = _hybrid({1: [7, 8, 9, 10]})
    lengths = np.array([10, 20, 30])
    out = hybrid.combine(
        ["a", "b", "c"], [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]], [0, 1, 2], lengths, None
    )
    assert out == [[1, 2], [7, 8, 9, 10], [9, 9]]
    assert hybrid.ngram.calls == [(4, [True, True, True])]  # k = DFlash's width this step
    assert hybrid.pending == {"a": ("dflash", 2, 10), "b": ("ngram", 4, 20), "c": ("dflash", 2, 30)}


def test_requests_missing_from_the_batch_keep_dflash_and_are_not_looked_up():
    hybrid = _hybrid({0: [5, 5]})
    out = hybrid.combine(["gone", "x"], [[1, 2, 3], [4, 5, 6]], [-1, 0], np.array([3]), None)
    assert out == [[1, 2], [5, 5]]
    assert hybrid.ngram.calls == [(3, [True])]
    assert "gone" not in hybrid.pending


def test_no_drafting_this_step_returns_the_drafts_untouched():
    hybrid = _hybrid({0: [1]})
    assert hybrid.combine(["a"], [[]], [0], np.array([4]), None) == [[]]
    assert hybrid.ngram.calls == []


def test_acceptance_is_counted_against_the_proposer_that_drafted():
    hybrid = _hybrid({0: [1, 2, 3, 4]})
    hybrid.combine(["a", "b"], [[9] * 4, [9] * 4], [0, 1], np.array([10, 50]), None)
    # next step: "a" grew by 3 (2 of its 4 n-gram tokens accepted + 1), "b" by 1 (0 accepted)
    hybrid.combine(["a", "b"], [[9] * 4, [9] * 4], [0, 1], np.array([13, 51]), None)
    counts = hybrid.snapshot()
    assert counts["ngram"] == {"drafts": 1, "drafted_tokens": 4, "accepted_tokens": 2}
    assert counts["dflash"] == {"drafts": 1, "drafted_tokens": 2, "accepted_tokens": 0}


def test_drafts_of_requests_that_left_the_batch_are_dropped_not_kept():
    hybrid = _hybrid({})
    hybrid.combine(["a", "b"], [[9] * 3, [9] * 3], [0, 1], np.array([10, 20]), None)
    hybrid.combine(["b"], [[9] * 3], [0], np.array([22]), None)  # "a" finished
    assert set(hybrid.pending) == {"b"}
    assert hybrid.snapshot()["dflash"] == {"drafts": 1, "drafted_tokens": 2, "accepted_tokens": 1}


def test_the_last_step_before_the_engine_idles_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(h, "STATS_INTERVAL_S", 0.2)
    path = str(tmp_path / "stats.json")
    hybrid = _hybrid({0: [1, 2]}, stats_path=path)
    hybrid.combine(["a"], [[3, 4, 5]], [0], np.array([5]), None)  # written at once
    hybrid.combine(["a"], [[3, 4, 5]], [0], np.array([8]), None)  # inside the interval
    assert h.proposer_rows(path) == (("dflash", 0, 0, 0), ("ngram", 0, 0, 0))
    deadline = time.monotonic() + 5
    while h.proposer_rows(path)[1] == ("ngram", 0, 0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.proposer_rows(path) == (("dflash", 0, 0, 0), ("ngram", 1, 2, 2))  # no later step


def test_counts_reach_the_stats_file_and_the_engine_stats(tmp_path, monkeypatch):
    monkeypatch.setattr(h, "STATS_INTERVAL_S", 0.0)
    kwargs = {"additional_config": {h.CONFIG_KEY: {"dflash_tokens": 2}}}
    environ: dict[str, str] = {}
    path = h.with_stats_path(kwargs, environ=environ)
    try:
        # by environment: vLLM hashes additional_config into its compile cache key
        assert environ == {
            h.STATS_ENV: path,
            "VLLM_USE_V2_MODEL_RUNNER": "0",
            "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": h.STATS_ENV,  # Ray executor's workers too
        }
        again = {"VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "A"}
        os.unlink(h.with_stats_path(kwargs, environ=again))
        assert again["VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"] == f"A,{h.STATS_ENV}"
        assert kwargs == {"additional_config": {h.CONFIG_KEY: {"dflash_tokens": 2}}}
        assert h.proposer_rows(path) == ()  # nothing reported yet
        hybrid = _hybrid({0: [1, 2]}, stats_path=path)
        hybrid.combine(["a"], [[3, 4, 5]], [0], np.array([5]), None)
        hybrid.combine(["a"], [[3, 4, 5]], [0], np.array([8]), None)
        assert h.proposer_rows(path) == (("dflash", 0, 0, 0), ("ngram", 1, 2, 2))
    finally:
        os.unlink(path)
    assert h.with_stats_path({"additional_config": {}}, environ=environ) is None
    assert h.with_stats_path({}, environ=environ) is None


def test_each_requests_own_counts_reach_the_file_for_its_spans(tmp_path, monkeypatch):
    monkeypatch.setattr(h, "STATS_INTERVAL_S", 0.0)
    monkeypatch.setattr(h, "REQUESTS_KEPT", 2)
    path = str(tmp_path / "stats.json")
    hybrid = _hybrid({0: [1, 2]}, stats_path=path)
    # vLLM's ids: the serving layer's ("chatcmpl-" + agentserve's) and 8 random characters
    ids = ["chatcmpl-r1-0a1b2c3d", "chatcmpl-r2-9f8e7d6c"]
    hybrid.combine(ids, [[3, 4, 5], [3, 4, 5]], [0, 1], np.array([5, 9]), None)
    hybrid.combine(ids, [[3, 4, 5], [3, 4, 5]], [0, 1], np.array([8, 10]), None)
    assert h.request_counts(path, "r1") == {
        "ngram": {"drafts": 1, "drafted_tokens": 2, "accepted_tokens": 2},
        "dflash": {"drafts": 0, "drafted_tokens": 0, "accepted_tokens": 0},
    }
    assert h.request_counts(path, "r2")["dflash"] == {
        "drafts": 1, "drafted_tokens": 2, "accepted_tokens": 0,
    }  # fmt: skip
    assert h.request_counts(path, "r3") is None
    hybrid.combine(["chatcmpl-r3-00000000"], [[3, 4, 5]], [0], np.array([4]), None)
    hybrid.combine(["chatcmpl-r3-00000000"], [[3, 4, 5]], [0], np.array([5]), None)
    assert h.request_counts(path, "r3") is not None
    assert h.request_counts(path, "r1") is None  # only the most recent REQUESTS_KEPT
    assert h.request_counts(tmp_path / "absent.json", "r3") is None


def test_hybrid_refuses_to_start_without_the_plugin_that_installs_it():
    from agentserve.engine.vllm_fixes import plugin_loaded

    assert plugin_loaded({}) and plugin_loaded({"VLLM_PLUGINS": "x, agentserve_fixes"})
    assert not plugin_loaded({"VLLM_PLUGINS": ""})
    kwargs = {"additional_config": {h.CONFIG_KEY: {"dflash_tokens": 2}}}
    with pytest.raises(ValueError, match="VLLM_PLUGINS leaves out agentserve_fixes"):
        h.with_stats_path(kwargs, plugin_loaded({"VLLM_PLUGINS": "other"}), environ={})
    assert h.with_stats_path({}, plugin_loaded=False) is None  # other methods: no matter
    with pytest.raises(ValueError, match="V1 model runner"):  # V2 has no hook
        h.with_stats_path(kwargs, environ={"VLLM_USE_V2_MODEL_RUNNER": "1"})


def test_vllms_own_ngram_proposer_drafts_the_continuation_of_a_match():
    pytest.importorskip("vllm")
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            prompt_lookup_min=2, prompt_lookup_max=3, num_speculative_tokens=3
        ),
        model_config=SimpleNamespace(max_model_len=32),
        scheduler_config=SimpleNamespace(max_num_seqs=2),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    hybrid = h.HybridDrafts(NgramProposer(config), dflash_tokens=1)
    tokens = np.zeros((2, 32), dtype=np.int32)
    tokens[0, :8] = [5, 6, 7, 8, 9, 1, 5, 6]  # "5 6" was seen before: continue with 7 8 9
    tokens[1, :4] = [1, 2, 3, 4]  # no repeat: DFlash drafts
    out = hybrid.combine(
        ["a", "b"], [[40, 41, 42], [50, 51, 52]], [0, 1], np.array([8, 4], dtype=np.int32), tokens
    )
    assert out == [[7, 8, 9], [50]]


def _runner(settings, taken, method="dflash", async_scheduling=False, sample="greedy"):
    spec = SimpleNamespace(method=method, num_speculative_tokens=4, draft_sample_method=sample)
    config = SimpleNamespace(
        additional_config={h.CONFIG_KEY: settings} if settings else {},
        speculative_config=spec,
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling, max_num_seqs=4),
        model_config=SimpleNamespace(max_model_len=64),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )

    class Runner:
        def take_draft_token_ids(self):
            return taken

    runner = Runner()
    runner.vllm_config = config
    runner.input_batch = SimpleNamespace(
        req_id_to_index={"a": 0, "b": 1},
        num_tokens_no_spec=np.array([6, 6], dtype=np.int32),
        token_ids_cpu=np.array([[1, 2, 3, 1, 2, 3] + [0] * 58, [4, 5, 6, 7, 8, 9] + [0] * 58]),
    )
    return runner


def test_the_runner_hook_combines_what_the_engine_core_takes():
    pytest.importorskip("vllm")
    settings = {"prompt_lookup_min": 2, "prompt_lookup_max": 3, "dflash_tokens": 2}
    runner = _runner(settings, Taken(["a", "b"], [[9, 9, 9, 9], [8, 8, 8, 8]]))
    take = h._wrap(type(runner).take_draft_token_ids)
    out = take(runner)
    assert isinstance(out, Taken)
    assert out.req_ids == ["a", "b"]
    assert out.draft_token_ids == [[1, 2, 3], [8, 8]]  # "2 3" matched: n-gram's 1 2 3
    assert runner._agentserve_hybrid.dflash_max_batch is None  # not in the settings: every batch
    limited = _runner({**settings, "dflash_max_batch": 2}, Taken(["a"], [[9, 9]]))
    h._wrap(type(limited).take_draft_token_ids)(limited)
    assert limited._agentserve_hybrid.dflash_max_batch == 2


def test_the_runner_hook_leaves_other_engines_alone():
    taken = Taken(["a"], [[9, 9]])
    runner = _runner(None, taken)
    assert h._wrap(type(runner).take_draft_token_ids)(runner) is taken
    assert runner._agentserve_hybrid is None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"method": "ngram"}, "method must be 'dflash'"),
        ({"async_scheduling": True}, "async scheduling must be off"),
        ({"sample": "probabilistic"}, "draft greedily"),
    ],
)
def test_engine_settings_that_would_lose_losslessness_are_refused(kw, message):
    runner = _runner({"dflash_tokens": 1}, None, **kw)
    with pytest.raises(ValueError, match=message):
        h.check_engine(runner.vllm_config)


def test_install_patches_the_runner_module_when_it_is_imported(tmp_path, monkeypatch):
    package = tmp_path / "fake_vllm_runner_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runner.py").write_text(
        "class GPUModelRunner:\n"
        "    def __init__(self, vllm_config):\n        self.vllm_config = vllm_config\n"
        "    def take_draft_token_ids(self):\n        return None\n"
        "    def propose_draft_token_ids(self, scheduler_output, sampled):\n        return []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "fake_vllm_runner_pkg.runner"
    monkeypatch.setattr(h, "RUNNER_MODULE", name)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    h.install()
    h.install()  # twice (several plugin loads in one process): one hook
    hooks = [f for f in sys.meta_path if isinstance(f, h._AfterImport) and f.name == name]
    assert len(hooks) == 1
    import fake_vllm_runner_pkg.runner as module

    assert module.GPUModelRunner.take_draft_token_ids.agentserve_hybrid
    assert module.GPUModelRunner.propose_draft_token_ids.agentserve_hybrid  # hybrid_block.py
    assert hooks[0] not in sys.meta_path
    # the hybrid drafts are built with the runner: bad settings fail the engine's start
    assert module.GPUModelRunner(SimpleNamespace(additional_config={}))._agentserve_hybrid is None
    bad = _runner({"dflash_tokens": 1}, None, async_scheduling=True).vllm_config
    with pytest.raises(ValueError, match="async scheduling must be off"):
        module.GPUModelRunner(bad)
    h.install()  # already imported: patched in place, once
    assert not hasattr(module.GPUModelRunner.take_draft_token_ids.__wrapped__, "__wrapped__")
    assert not hasattr(module.GPUModelRunner.__init__.__wrapped__, "__wrapped__")
    propose = module.GPUModelRunner.propose_draft_token_ids
    assert not hasattr(propose.__wrapped__, "__wrapped__")
    sys.modules.pop(name, None)
    sys.modules.pop("fake_vllm_runner_pkg", None)

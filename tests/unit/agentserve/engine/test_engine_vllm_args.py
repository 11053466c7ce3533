"""DeploymentSpec -> vLLM engine arguments."""

from __future__ import annotations

import pytest
from agentserve.engine.vllm_args import (
    DrafterMissingError,
    engine_kwargs,
    exports_vllm_metrics,
    hybrid_config,
    speculative_config,
)
from agentserve.spec import DeploymentSpec


def _model(**drafter):
    return DeploymentSpec.model_validate({"models": [{"name": "m", "drafter": drafter}]}).models[0]


def test_no_drafter_means_no_speculation():
    kwargs = engine_kwargs(_model(), "/models/x")
    assert kwargs["speculative_config"] is None
    assert kwargs["model"] == "/models/x" and kwargs["served_model_name"] == ["m"]
    assert kwargs["disable_log_stats"] is False


def test_the_engine_streams_every_few_tokens_while_the_replica_coalesces():
    # the first and last token at once, then one output per stream_interval_tokens: the
    # replica builds and reads one chunk per interval (measured 1.06-1.11x decode tok/s)
    assert engine_kwargs(_model(), "/m")["stream_interval"] == 8
    spec = {"models": [{"name": "m", "stream_interval_tokens": 3}]}
    assert (
        engine_kwargs(DeploymentSpec.model_validate(spec).models[0], "/m")["stream_interval"] == 3
    )
    spec = {"models": [{"name": "m", "stream_interval_ms": 0}]}  # every step, as asked
    assert (
        engine_kwargs(DeploymentSpec.model_validate(spec).models[0], "/m")["stream_interval"] == 1
    )


def test_dflash_drafter_maps_to_speculative_config(drafter_dir):
    cfg = speculative_config(_model(enabled=True, path=str(drafter_dir), num_speculative_tokens=15))
    assert cfg == {"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": 15}


def test_drafter_checkpoint_is_checked_before_vllm_sees_it(drafter_dir):
    with pytest.raises(DrafterMissingError, match=r"num_speculative_tokens 16 exceeds.*= 15"):
        speculative_config(_model(enabled=True, path=str(drafter_dir), num_speculative_tokens=16))
    (drafter_dir / "config.json").write_text('{"layer_types": ["sliding_attention"]}')
    with pytest.raises(DrafterMissingError, match="layer_types"):
        speculative_config(_model(enabled=True, path=str(drafter_dir)))


def test_an_unset_k_drafts_what_the_drafters_block_holds():
    """The shipped drafter's block holds 4 drafts, under the spec's default k of 7: a spec
    that leaves k unset (the operator's and the tests' specs skip `up`'s resolve_drafters)
    drafts 4, its schedule capped there; a k the spec sets past the block is refused."""
    from agentserve.drafters import BUNDLED_DRAFTER_DIR

    from dflash.config import DFlashConfig

    most = DFlashConfig.load(BUNDLED_DRAFTER_DIR).num_draft_tokens
    assert most < 7  # the premise: a block smaller than the spec's default k
    for method in ("dflash", "hybrid"):
        cfg = speculative_config(_model(enabled=True, method=method))
        assert cfg["num_speculative_tokens"] == most
    scheduled = _model(enabled=True, num_speculative_tokens_per_batch_size=[[1, 1, 7], [2, 8, 2]])
    assert speculative_config(scheduled)["num_speculative_tokens_per_batch_size"] == [
        (1, 1, most),
        (2, 8, 2),
    ]
    with pytest.raises(DrafterMissingError, match="num_speculative_tokens 7 exceeds"):
        speculative_config(_model(enabled=True, num_speculative_tokens=7))


def test_hybrid_drafts_n_gram_past_the_block_and_dflash_within_it():
    """Hybrid's n-gram drafts may be longer than the drafter's block: DFlash's own draft is
    cut to dflash_tokens, and only that must fit the block (served at k=8, DFlash's
    acceptance in hybrid was what it is at k=4, docs/benchmarks.md)."""
    from agentserve.drafters import BUNDLED_DRAFTER_DIR

    from dflash.config import DFlashConfig

    most = DFlashConfig.load(BUNDLED_DRAFTER_DIR).num_draft_tokens
    cfg = speculative_config(_model(enabled=True, method="hybrid", num_speculative_tokens=8))
    assert cfg["method"] == "dflash" and cfg["num_speculative_tokens"] == 8
    past = {"method": "hybrid", "num_speculative_tokens": 8, "dflash_tokens": most + 1}
    with pytest.raises(DrafterMissingError, match=f"dflash_tokens {most + 1} exceeds"):
        speculative_config(_model(enabled=True, **past))


def test_missing_drafter_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DrafterMissingError, match="train-drafter"):
        speculative_config(_model(enabled=True, path=str(tmp_path / "missing")))


def test_speculation_schedule_passes_through_to_vllm(drafter_dir):
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    schedule = [[1, 1, 4], [2, 4, 2], [5, 8, 0]]
    drafter = {"enabled": True, "path": str(drafter_dir), "num_speculative_tokens": 4}
    cfg = speculative_config(_model(**drafter, num_speculative_tokens_per_batch_size=schedule))
    assert cfg["num_speculative_tokens_per_batch_size"] == [(1, 1, 4), (2, 4, 2), (5, 8, 0)]
    lookup = build_dynamic_sd_schedule_lookup(cfg["num_speculative_tokens_per_batch_size"], 8, 4)
    assert lookup[1:] == [4, 2, 2, 2, 0, 0, 0, 0]
    assert "num_speculative_tokens_per_batch_size" not in speculative_config(_model(**drafter))


@pytest.mark.parametrize(
    "schedule, ok",
    [
        ([[1, 1, 3], [2, 16, 1]], True),
        ([[1, 4, 2], [9, 16, 0]], True),  # a gap keeps the previous k (vLLM carries it)
        ([[1, 7, 7]], True),
        ([[2, 4, 1]], False),  # first range must start at 1
        ([[1, 4, 1], [4, 8, 0]], False),  # overlap
        ([[1, 4, 1], [9, 12, 0], [5, 8, 0]], False),  # unsorted (vLLM would sort it)
        ([[1, 0, 1]], False),  # start > end
        ([[1, 4, 8]], False),  # k > num_speculative_tokens (vLLM would clamp it)
        ([[1, 4, -1]], False),
        ([[1, 4]], False),
        ([], False),
    ],
)
def test_schedule_validation_is_at_least_as_strict_as_vllm(schedule, ok):
    from agentserve.spec import SpecError, spec_from_dict
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    drafter = {"enabled": True, "num_speculative_tokens": 7}
    data = {"models": [{"drafter": {**drafter, "num_speculative_tokens_per_batch_size": schedule}}]}
    if ok:
        spec_from_dict(data)
        validate_and_normalize_dynamic_sd_schedule(schedule)  # vLLM accepts it too
    else:
        with pytest.raises(SpecError, match="num_speculative_tokens_per_batch_size"):
            spec_from_dict(data)


def test_frontend_enables_tool_calling_with_a_text_parser():
    from agentserve.engine.vllm_args import TOOL_CALL_PARSER, frontend_kwargs
    from vllm.tool_parsers import ToolParserManager

    kwargs = frontend_kwargs(DeploymentSpec().models[0])
    assert kwargs == {
        "enable_auto_tool_choice": True,
        "tool_call_parser": TOOL_CALL_PARSER,
        "enable_prompt_tokens_details": True,  # cached prompt tokens for the autoscaler
    }
    assert ToolParserManager.get_tool_parser(TOOL_CALL_PARSER) is not None


def test_the_tool_call_parser_follows_the_spec_else_the_models_type(tmp_path):
    """gpt-oss speaks Harmony: vLLM refuses to start its parser beside any tool parser but
    its own, so a gpt-oss model gets `openai` unless the spec names one; a named parser
    must exist in the installed vLLM."""
    from agentserve.engine.vllm_args import engine_kwargs, tool_call_parser
    from vllm.tool_parsers import ToolParserManager

    plain = DeploymentSpec().models[0]
    (tmp_path / "config.json").write_text('{"model_type": "gpt_oss"}')
    assert tool_call_parser(plain, tmp_path) == "openai"
    assert ToolParserManager.get_tool_parser("openai") is not None
    assert tool_call_parser(plain, tmp_path / "nowhere") == "hermes"
    llama = plain.model_copy(update={"tool_call_parser": "llama3_json"})
    assert tool_call_parser(llama, tmp_path) == "llama3_json"  # the spec wins
    typo = plain.model_copy(update={"tool_call_parser": "llama3_jsn"})
    with pytest.raises(ValueError, match="did you mean 'llama3_json'"):
        tool_call_parser(typo)
    with pytest.raises(ValueError, match="not a vLLM tool parser"):
        engine_kwargs(typo, tmp_path)  # before the engine starts


def _with_engine_args(engine_args):
    spec = {"models": [{"name": "m", "engine_args": engine_args}]}
    return DeploymentSpec.model_validate(spec).models[0]


def test_engine_args_reach_vllm_and_are_checked_against_its_fields():
    kwargs = engine_kwargs(_with_engine_args({"enforce_eager": True, "seed": 3}), "/m")
    assert kwargs["enforce_eager"] is True and kwargs["seed"] == 3
    with pytest.raises(ValueError, match=r"'enforce_eagre'.*did you mean 'enforce_eager'"):
        engine_kwargs(_with_engine_args({"enforce_eagre": True}), "/m")


@pytest.mark.parametrize(
    ("engine_args", "message"),
    [
        ({"max_model_len": 64}, "use that field instead"),
        ({"stream_interval": 1}, "stream_interval_tokens"),
        ({"speculative_config": {}}, "from `drafter`"),
        ({"not a name": 1}, "is not a vLLM argument name"),
    ],
)
def test_engine_args_that_the_spec_owns_are_refused(engine_args, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        _with_engine_args(engine_args)


def _drafter_model(source="smollm2-135m-instruct", **drafter):
    spec = {"models": [{"name": "m", "source": source, "drafter": {"enabled": True, **drafter}}]}
    return DeploymentSpec.model_validate(spec).models[0]


def test_ngram_needs_no_drafter_and_passes_its_lookup_window():
    cfg = speculative_config(_drafter_model(method="ngram", prompt_lookup_max=5))
    assert cfg == {
        "method": "ngram",
        "num_speculative_tokens": 7,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }
    cfg = speculative_config(_drafter_model(source="/models/qwen", method="mtp"))
    assert cfg == {"method": "mtp", "num_speculative_tokens": 7}


def test_hybrid_runs_vllms_dflash_and_hands_its_lookup_window_to_the_runner_hook(drafter_dir):
    model = _drafter_model(
        source="/m", method="hybrid", path=str(drafter_dir), num_speculative_tokens=4
    )
    assert speculative_config(model) == {
        "method": "dflash",
        "model": str(drafter_dir),
        "num_speculative_tokens": 4,
    }
    kwargs = engine_kwargs(model, "/models/x")
    assert kwargs["additional_config"] == {
        "agentserve_hybrid": {
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
            "dflash_tokens": 3,
            "dflash_max_batch": 1,  # the spec default: n-gram alone above one request
        }
    }
    assert kwargs["async_scheduling"] is False  # vLLM's GPU default for DFlash would skip the hook
    for engine_args, message in (
        ({"additional_config": {"mine": 1}}, "replaces the settings"),
        ({"async_scheduling": True}, "needs async_scheduling off"),
    ):
        with pytest.raises(ValueError, match=message):
            engine_kwargs(model, "/models/x", **engine_args)
    dflash = _drafter_model(source="/m", method="dflash", path=str(drafter_dir))
    assert hybrid_config(dflash) is None and "additional_config" not in engine_kwargs(dflash, "/x")


def test_eagle3_points_vllm_at_its_drafter(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = speculative_config(_drafter_model(source="/m", method="eagle3", path=str(tmp_path)))
    assert cfg == {"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 7}


def test_suffix_without_arctic_inference_is_a_clear_error(monkeypatch):
    import agentserve.engine.vllm_args as vllm_args

    monkeypatch.setattr(vllm_args, "find_spec", lambda name: None)
    with pytest.raises(DrafterMissingError, match="pip install arctic-inference"):
        speculative_config(_drafter_model(method="suffix"))


@pytest.mark.parametrize(
    ("source", "drafter", "message"),
    [
        ("smollm2-135m-instruct", {"method": "ngram", "path": "/d"}, "uses no drafter model"),
        ("/m", {"method": "eagle3"}, "eagle3 needs an EAGLE-3 drafter"),
        ("/m", {"method": "dflash"}, "only fits the bundled model"),
        ("/m", {"method": "hybrid"}, "only fits the bundled model"),
        (
            "smollm2-135m-instruct",
            {"method": "hybrid", "num_speculative_tokens": 2, "dflash_tokens": 3},
            "one engine k bounds both",
        ),
        ("/m", {"method": "ngram", "prompt_lookup_min": 5}, "must be <= prompt_lookup_max"),
        ("/m", {"method": "medusa"}, "Input should be"),
    ],
)
def test_speculative_methods_are_validated(source, drafter, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        _drafter_model(source=source, **drafter)


def test_hybrid_with_async_scheduling_is_refused():
    from pydantic import ValidationError

    spec = {"name": "m", "async_scheduling": True, "drafter": {"enabled": True, "method": "hybrid"}}
    with pytest.raises(ValidationError, match="hybrid drafting needs it off"):
        DeploymentSpec.model_validate({"models": [spec]})


@pytest.mark.parametrize(
    ("environ", "exported"),
    [
        ({}, False),  # embedded `up`: agentserve's own /metrics
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, True),  # a pod: Ray's metrics port
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "AGENTSERVE_VLLM_METRICS": "0"}, False),
        ({"AGENTSERVE_VLLM_METRICS": "1"}, True),
    ],
)
def test_vllm_metrics_reach_rays_metrics_port_in_a_pod(environ, exported):
    assert exports_vllm_metrics(environ) is exported
    assert exports_vllm_metrics({"AGENTSERVE_VLLM_METRICS": "False"}) is False


def test_exporting_keeps_vllms_own_prometheus_logger_that_stats_reads():
    pytest.importorskip("vllm")
    from agentserve.engine.vllm_engine import stat_loggers
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

    ours = object()
    assert stat_loggers(ours, export=False) == [ours]
    exported = stat_loggers(ours, export=True)
    assert exported[0] is ours and PrometheusStatLogger in exported
    assert RayPrometheusStatLogger in exported

"""vLLM's and Ray Serve LLM's field names in a model section (spec/aliases.py): accepted as
the canonical fields, conflicts and unknown names refused, the schema unchanged."""

from __future__ import annotations

import pytest
import yaml
from agentserve.spec import SpecError, spec_from_dict, spec_json_schema
from agentserve.spec.aliases import canonical_model_fields

HUB = "Qwen/Qwen3-8B"

RAY_SERVE_LLM = """
models:
  - model_loading_config:
      model_id: qwen3-8b
      model_source: Qwen/Qwen3-8B
    engine_kwargs:
      max_model_len: 8192
      tensor_parallel_size: 2
      gpu_memory_utilization: 0.85
      enforce_eager: true
      speculative_config:
        method: eagle3
        model: org/qwen3-8b-eagle3
        num_speculative_tokens: 3
    replicas: {num_gpus: 2}
"""


def test_a_ray_serve_llm_section_is_accepted():
    model = spec_from_dict(yaml.safe_load(RAY_SERVE_LLM)).models[0]
    assert (model.name, model.source) == ("qwen3-8b", HUB)
    assert (model.max_model_len, model.tensor_parallel_size) == (8192, 2)
    assert model.gpu_memory_utilization == 0.85
    assert model.engine_args == {"enforce_eager": True}
    drafter = model.drafter
    assert (drafter.enabled, drafter.method, drafter.path) == (
        True,
        "eagle3",
        "org/qwen3-8b-eagle3",
    )
    assert drafter.num_speculative_tokens == 3


def test_vllm_names_at_the_model_level():
    model = spec_from_dict(
        {
            "models": [
                {
                    "source": HUB,
                    "stream_interval": 4,
                    "speculative_config": {
                        "method": "ngram",
                        "num_speculative_tokens": 5,
                        "prompt_lookup_max": 3,
                    },
                }
            ]
        }
    ).models[0]
    assert model.stream_interval_tokens == 4
    assert (model.drafter.enabled, model.drafter.method) == (True, "ngram")
    assert (model.drafter.num_speculative_tokens, model.drafter.prompt_lookup_max) == (5, 3)


def test_speculative_config_null_turns_drafting_off():
    model = spec_from_dict({"models": [{"speculative_config": None}]}).models[0]
    assert model.drafter.enabled is False


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"max_model_len": 4096, "engine_kwargs": {"max_model_len": 8192}}, "both set"),
        (
            {"engine_args": {"enforce_eager": False}, "engine_kwargs": {"enforce_eager": True}},
            "both",
        ),
        ({"stream_interval": 2, "stream_interval_tokens": 8}, "both set"),
        ({"speculative_config": {"method": "ngram"}, "drafter": {"enabled": False}}, "both set"),
        (
            {"speculative_config": {"method": "ngram", "draft_tensor_parallel_size": 1}},
            "equivalent",
        ),
        ({"model_loading_config": {"model_id": "m", "lora": 1}}, "no agentserve equivalent"),
        ({"engine_kwargs": ["max_model_len"]}, "expected a mapping"),
        # a spec-owned vLLM argument without a same-named field is still refused
        ({"engine_kwargs": {"served_model_name": "x"}}, "set by agentserve"),
        ({"engine_kwarg": {}}, "engine_kwarg"),  # unknown fields stay refused
    ],
)
def test_conflicts_and_unknown_names_are_refused(section, message):
    with pytest.raises(SpecError, match=message):
        spec_from_dict({"models": [section]})


def test_same_value_twice_is_fine_and_input_is_not_changed():
    section = {"max_model_len": 4096, "engine_kwargs": {"max_model_len": 4096}}
    assert canonical_model_fields(section) == {"max_model_len": 4096}
    assert section == {"max_model_len": 4096, "engine_kwargs": {"max_model_len": 4096}}


def test_the_schema_names_only_canonical_fields():
    schema = spec_json_schema()
    model = schema["$defs"]["ModelSpec"]["properties"]
    assert "engine_args" in model and "drafter" in model
    assert not {"engine_kwargs", "speculative_config", "stream_interval"} & set(model)

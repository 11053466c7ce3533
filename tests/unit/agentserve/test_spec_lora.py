"""models[].lora: adapters (name -> hub id or local path), max_lora_rank, max_loras; adapter
names unique across the deployment; the JSON schema documents every field."""

from __future__ import annotations

import pytest
from agentserve.spec import LoraSpec, SpecError, spec_from_dict, spec_json_schema


def _spec(*models):
    return spec_from_dict({"models": list(models)})


def test_adapters_parse_with_defaults():
    spec = _spec({"name": "m", "lora": {"adapters": {"sql": "./adapters/sql", "chat": "org/x"}}})
    lora = spec.models[0].lora
    assert lora == LoraSpec(adapters={"sql": "./adapters/sql", "chat": "org/x"})
    assert (lora.max_lora_rank, lora.max_loras) == (16, 1)
    assert _spec({"name": "m"}).models[0].lora is None  # no adapters by default


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"adapters": {}}, "at least 1"),
        ({"adapters": {"a:b": "./x"}}, "adapter name 'a:b'"),
        ({"adapters": {"a/b": "./x"}}, "adapter name 'a/b'"),
        ({"adapters": {"sql": "not a path"}}, "neither a Hugging Face id"),
        ({"adapters": {"sql": "./x"}, "max_lora_rank": 12}, "max_lora_rank"),
        ({"adapters": {"sql": "./x"}, "max_loras": 0}, "max_loras"),
        ({"adapters": {"sql": "./x"}, "path": "./x"}, "unknown field"),
    ],
)
def test_bad_lora_sections_are_refused_by_field(lora, message):
    with pytest.raises(SpecError, match=message) as err:
        _spec({"name": "m", "lora": lora})
    assert "models[0].lora" in str(err.value)


def test_adapter_names_must_name_one_thing_in_the_deployment():
    with pytest.raises(SpecError, match=r"lora.adapters.b: the name is taken \(by models\[1\]"):
        _spec({"name": "a", "lora": {"adapters": {"b": "./x"}}}, {"name": "b"})
    with pytest.raises(SpecError, match=r"models\[1\].lora.adapters.x: the name is taken"):
        _spec(
            {"name": "a", "lora": {"adapters": {"x": "./x"}}},
            {"name": "b", "lora": {"adapters": {"x": "./y"}}},
        )


def test_the_engine_arguments_lora_decides_are_not_engine_args():
    with pytest.raises(SpecError, match=r"engine_args\.enable_lora: set by agentserve from `lora`"):
        _spec({"name": "m", "engine_args": {"enable_lora": True}})
    with pytest.raises(SpecError, match="max_lora_rank: set by agentserve"):
        _spec({"name": "m", "engine_args": {"max_lora_rank": 8}})


def test_an_embedding_model_serves_no_adapters():
    with pytest.raises(SpecError, match="embedding model"):
        _spec({"name": "e", "task": "embed", "lora": {"adapters": {"x": "./x"}}})


def test_the_schema_has_lora_with_descriptions():
    schema = spec_json_schema()
    lora = schema["$defs"]["LoraSpec"]
    assert set(lora["properties"]) == {"adapters", "max_lora_rank", "max_loras"}
    assert all(p.get("description") for p in lora["properties"].values())
    assert lora.get("additionalProperties") is False


def test_the_readme_lora_example_is_a_valid_spec():
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```yaml\n(# lora\.yaml.*?)```", readme, flags=re.S)
    model = spec_from_dict(yaml.safe_load(block)).models[0]
    assert model.lora.adapters == {
        "sql": "./adapters/sql-lora",
        "support": "my-org/qwen3-8b-support-lora",
    }
    assert (model.lora.max_lora_rank, model.lora.max_loras) == (16, 2)

"""A request's `model` -> (model, adapter): a model's name, an adapter's, <model>:<adapter>;
an unknown adapter of a served model is a 404."""

from __future__ import annotations

import pytest
from agentserve.admission.adapter_names import ModelNames
from agentserve.api.errors import ModelNotFoundError
from agentserve.spec import DeploymentSpec

SPEC = DeploymentSpec.model_validate(
    {
        "models": [
            {"name": "base", "lora": {"adapters": {"sql": "./sql", "chat": "org/chat"}}},
            {"name": "org/other"},
        ]
    }
)


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("base", ("base", None)),
        ("org/other", ("org/other", None)),
        ("sql", ("base", "sql")),
        ("base:chat", ("base", "chat")),
        ("unknown", ("unknown", None)),  # admission's 404
        ("org/other:sql", ("org/other:sql", None)),  # not this model's adapter: 404 later
    ],
)
def test_resolve(requested, expected):
    names = ModelNames(SPEC.models)
    if requested == "org/other:sql":
        with pytest.raises(ModelNotFoundError):
            names.resolve(requested)
        return
    assert names.resolve(requested) == expected


def test_an_unknown_adapter_of_a_served_model_is_model_not_found():
    with pytest.raises(ModelNotFoundError) as err:
        ModelNames(SPEC.models).resolve("base:nope")
    assert err.value.status == 404 and err.value.code == "model_not_found"
    assert "sql" in err.value.message  # the served names, adapters included


def test_rewrite_names_the_base_model_and_leaves_other_bodies_alone():
    names = ModelNames(SPEC.models)
    body = {"model": "base:sql", "messages": []}
    assert names.rewrite(body) == ({"model": "base", "messages": []}, "sql")
    assert body["model"] == "base:sql"  # a copy
    assert names.rewrite({"model": "base"}) == ({"model": "base"}, None)
    assert names.rewrite({"model": 3}) == ({"model": 3}, None)  # validation's 400
    assert names.rewrite([1]) == ([1], None)
    plain = ModelNames(DeploymentSpec().models)  # no adapters: nothing rewritten
    assert plain.rewrite({"model": "x:y"}) == ({"model": "x:y"}, None)


def test_served_lists_models_then_adapters():
    assert ModelNames(SPEC.models).served() == ["base", "org/other", "sql", "chat"]

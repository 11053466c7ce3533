"""The bundled model is served in the dtype measured fastest through the server on the
replicas' kind of CPU (its profile's speculation section), speculating or not, unless the
spec sets one; other models, GPU replicas and unlisted kinds keep the spec's dtype."""

from __future__ import annotations

import agentserve.spec.defaults as spec_defaults
import pytest
from agentserve.sources.models import BUNDLED_MODEL
from agentserve.spec import spec_from_dict
from profile_fakes import set_profile

BUNDLED = {"name": "small", "source": BUNDLED_MODEL, "replicas": {"num_gpus": 0}}


@pytest.fixture
def float32_on_avx2(monkeypatch):
    measured = {"method": "ngram", "num_speculative_tokens": 8, "dtype": "float32"}
    set_profile(monkeypatch, "avx2", speculation={BUNDLED_MODEL: measured})


@pytest.mark.parametrize("flag", [None, False, True])
def test_the_measured_dtype_applies_with_and_without_speculation(float32_on_avx2, flag):
    spec = spec_from_dict({"models": [BUNDLED]})
    resolved, notes = spec_defaults.resolve_drafters(spec, flag, machine="avx2")
    assert resolved.models[0].dtype == "float32"
    assert any("served in float32" in note for note in notes), notes
    # another kind of machine keeps the model's own
    other, _ = spec_defaults.resolve_drafters(spec, flag, machine="amx")
    assert other.models[0].dtype == "bfloat16"


def test_a_dtype_the_spec_sets_wins(float32_on_avx2):
    spec = spec_from_dict({"models": [{**BUNDLED, "dtype": "bfloat16"}]})
    resolved, _ = spec_defaults.resolve_drafters(spec, machine="avx2")
    assert resolved.models[0].dtype == "bfloat16"


def test_gpu_replicas_and_other_models_keep_theirs(float32_on_avx2):
    gpu = {**BUNDLED, "replicas": {"num_gpus": 1}}
    other = {"name": "other", "source": "Qwen/Qwen3-0.6B", "replicas": {"num_gpus": 0}}
    spec = spec_from_dict({"models": [gpu, other]})
    out = spec_defaults.with_default_dtype(spec, "float32")
    assert [m.dtype for m in out.models] == ["auto", "bfloat16"]  # GPU: the device default


def test_the_copy_keeps_what_the_spec_left_unset(float32_on_avx2):
    """The later defaults read which drafter fields the spec set: the dtype default must not
    mark them set (a spec that leaves drafter.enabled open still gets the default method)."""
    spec = spec_from_dict({"models": [BUNDLED]})
    out = spec_defaults.with_default_dtype(spec, "float32")
    assert out.models[0].dtype == "float32"
    assert "enabled" not in out.models[0].drafter.model_fields_set
    assert spec_defaults.with_default_dtype(spec, None) is spec

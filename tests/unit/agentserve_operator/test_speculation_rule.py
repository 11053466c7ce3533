"""One speculation rule for `agentserve up` and the operator (spec_defaults.resolve_drafters):
a model that leaves drafter.enabled unset speculates with the method measured for the kind
of machine its replicas run on; the operator names that kind (GPU replicas "cuda", CPU
replicas of unknown kind) instead of using its own CPU, and never calibrates."""

from __future__ import annotations

import agentserve.spec.defaults as spec_defaults
import pytest
from agentserve import profiles
from agentserve.drafters import default_speculation, has_served_speculation
from agentserve.sources.models import BUNDLED_MODEL
from agentserve.spec import spec_from_dict
from agentserve_operator.resource import desired_from_cr, replica_machine
from operator_cases import gpu_cr

KEYS = {"alice": "sk-alice-secret"}
BUNDLED = {"name": "small", "source": BUNDLED_MODEL, "replicas": {"num_gpus": 0}}


def _desired(model):
    cr = gpu_cr(models=[model])
    cr["metadata"] = {**cr["metadata"], "uid": "u-1"}
    return desired_from_cr(cr, KEYS)


def test_cpu_replicas_on_a_cluster_follow_the_rule_for_an_unknown_kind(monkeypatch):
    def no_calibration(*_):
        raise AssertionError("the operator calibrated on its own CPU")

    monkeypatch.setattr(spec_defaults, "_calibrate_choice", no_calibration)
    (model,) = _desired(BUNDLED).spec.models
    assert replica_machine(_desired(BUNDLED).spec) == "cpu"
    assert not has_served_speculation(BUNDLED_MODEL, "cpu") and not model.drafter.enabled
    # the same spec under the same rule on a kind with served figures speculates as measured
    spec = spec_from_dict({"models": [BUNDLED]})
    measured = [p.stem for p in profiles.PROFILE_DIR.glob("*.json")]
    for machine in [m for m in measured if has_served_speculation(BUNDLED_MODEL, m)]:
        resolved, _ = spec_defaults.resolve_drafters(spec, machine=machine)
        method = default_speculation(BUNDLED_MODEL, machine)
        assert resolved.models[0].drafter.enabled == (method is not None), machine
        if method:
            assert resolved.models[0].drafter.method == method


def test_gpu_replicas_are_cuda_and_an_explicit_drafter_is_kept():
    gpu = {**BUNDLED, "replicas": {"num_gpus": 1}}
    desired = _desired(gpu)
    assert replica_machine(desired.spec) == "cuda"
    assert desired.spec.models[0].drafter.enabled is (
        default_speculation(BUNDLED_MODEL, "cuda") is not None
    )
    explicit = {**gpu, "drafter": {"enabled": True, "method": "ngram"}}
    (model,) = _desired(explicit).spec.models
    assert model.drafter.enabled and model.drafter.method == "ngram"
    # and its batch-size schedule is filled as before (speculation_schedule: auto)
    assert model.drafter.speculation_schedule == "auto"


@pytest.mark.parametrize("machine", ["cpu", "cuda"])
def test_the_operator_result_is_resolve_drafters_for_the_replicas_machine(machine):
    model = {**BUNDLED, "replicas": {"num_gpus": 1 if machine == "cuda" else 0}}
    desired = _desired(model)
    alone, _ = spec_defaults.resolve_drafters(spec_from_dict({"models": [model]}), machine=machine)
    assert desired.spec.models[0].drafter == alone.models[0].drafter


def test_a_catalogued_gpu_model_gets_its_dflash_drafter_and_the_gpu_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # the operator's pod: no model cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    qwen = {"name": "qwen3-8b", "source": "Qwen/Qwen3-8B", "replicas": {"num_gpus": 1}}
    (model,) = _desired(qwen).spec.models
    assert (model.drafter.enabled, model.drafter.method) == (True, "dflash")
    assert (model.drafter.path, model.drafter.num_speculative_tokens) == (
        "z-lab/Qwen3-8B-DFlash-b16",
        15,
    )
    # dtype auto; the context length is the engine's to read (and fit) where the pod starts
    assert (model.dtype, model.max_model_len, model.max_num_seqs) == ("auto", None, None)
    opted_out = {**qwen, "drafter": {"enabled": False}}
    assert not _desired(opted_out).spec.models[0].drafter.enabled

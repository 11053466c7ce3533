"""GPU engine settings: spec validation, vLLM engine args, Ray placement of TP x PP replicas."""

from __future__ import annotations

import pytest
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.placement import replica_placement
from agentserve.spec import SPEC_OWNED_ENGINE_ARGS, ModelSpec, SpecError, spec_from_dict


def _model(**fields) -> ModelSpec:
    return spec_from_dict({"models": [{"name": "m", "source": "/models/m", **fields}]}).models[0]


def _gpus(n: int, nodes: int = 1, **replicas) -> dict:
    return {"num_gpus": n, "nodes_per_replica": nodes, **replicas}


def test_defaults_keep_the_cpu_engine_args(monkeypatch):
    monkeypatch.setenv("AGENTSERVE_CPU_EXECUTOR", "mp")  # "uni" adds its backend (cpu_settings)
    kwargs = engine_kwargs(_model(), "/models/m")
    assert kwargs["tensor_parallel_size"] == 1 and kwargs["pipeline_parallel_size"] == 1
    assert kwargs["enable_prefix_caching"] is True
    for absent in ("distributed_executor_backend", "gpu_memory_utilization", "quantization",
                   "kv_cache_dtype", "max_num_batched_tokens"):  # fmt: skip
        assert absent not in kwargs, absent


def test_gpu_settings_map_to_vllm_engine_args():
    model = _model(
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.85,
        quantization="fp8",
        kv_cache_dtype="fp8_e4m3",
        max_num_batched_tokens=8192,
        enable_prefix_caching=False,
        replicas=_gpus(8),
    )
    kwargs = engine_kwargs(model, "/models/m")
    assert {k: kwargs[k] for k in (
        "tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend",
        "gpu_memory_utilization", "quantization", "kv_cache_dtype", "max_num_batched_tokens",
        "enable_prefix_caching")} == {
        "tensor_parallel_size": 4, "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray", "gpu_memory_utilization": 0.85,
        "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "max_num_batched_tokens": 8192,
        "enable_prefix_caching": False,
    }  # fmt: skip


def test_engine_args_are_accepted_by_vllms_own_engine_args():
    """vLLM's AsyncEngineArgs takes every key (names and types) the mapping produces."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    model = _model(tensor_parallel_size=2, quantization="awq", max_num_batched_tokens=4096,
                   gpu_memory_utilization=0.5, kv_cache_dtype="fp8", replicas=_gpus(2))  # fmt: skip
    args = AsyncEngineArgs(**engine_kwargs(model, "/models/m"))
    assert (args.tensor_parallel_size, args.distributed_executor_backend) == (2, "ray")
    assert args.kv_cache_dtype == "fp8" and args.max_num_batched_tokens == 4096


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tensor_parallel_size": 8}, r"num_gpus \(0\) must equal.*8 x 1 = 8"),
        ({"tensor_parallel_size": 8, "replicas": _gpus(4)}, r"num_gpus \(4\) must equal"),
        ({"replicas": _gpus(2)}, r"num_gpus \(2\) must equal.*1 x 1 = 1"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"pipeline_parallel_size": 65}, "pipeline_parallel_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
        ({"quantization": "FP 8"}, "quantization"),
        ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, r"must be >= max_num_seqs \(8\)"),
        ({"tensor_parallel_size": 8, "pipeline_parallel_size": 3, "replicas": _gpus(24, 2)},
         r"nodes_per_replica \(2\) must divide pipeline_parallel_size \(3\)"),
        ({"replicas": _gpus(0, 2)}, "needs GPUs"),
    ],
)  # fmt: skip
def test_bad_gpu_settings_are_refused_by_field(fields, message):
    with pytest.raises(SpecError, match=message):
        _model(**fields)


@pytest.mark.parametrize("key", ["tensor_parallel_size", "pipeline_parallel_size",
                                 "gpu_memory_utilization", "quantization", "kv_cache_dtype",
                                 "max_num_batched_tokens", "enable_prefix_caching",
                                 "distributed_executor_backend", "revision"])  # fmt: skip
def test_engine_args_cannot_set_what_a_field_owns(key):
    assert key in SPEC_OWNED_ENGINE_ARGS
    with pytest.raises(SpecError, match=f"engine_args.{key}: set by agentserve"):
        _model(engine_args={key: 1})


def test_unknown_quantization_is_named_when_the_engine_args_are_built():
    with pytest.raises(ValueError, match=r"'fp9' is not a vLLM method; did you mean 'fp8'"):
        engine_kwargs(_model(quantization="fp9"), "/models/m")


def test_one_gpu_replica_has_no_placement_group():
    placement = replica_placement(_model(replicas=_gpus(1)), group_resource="g")
    assert placement == {"ray_actor_options": {"num_cpus": 2.0, "num_gpus": 1,
                                               "resources": {"g": 1}}}  # fmt: skip


def test_tp8_replica_gets_eight_gpu_bundles_on_one_node():
    model = _model(tensor_parallel_size=8, replicas=_gpus(8, num_cpus=4))
    placement = replica_placement(model, group_resource="g")
    bundles = placement["placement_group_bundles"]
    assert len(bundles) == 8 and all(b["GPU"] == 1 and b["g"] == 0.125 for b in bundles)
    assert bundles[0]["CPU"] == 4 and all("CPU" not in b for b in bundles[1:])
    assert placement["placement_group_strategy"] == "STRICT_PACK"
    # the replica actor holds no GPU: each vLLM worker takes one bundle's GPU
    assert placement["ray_actor_options"] == {"num_cpus": 4, "num_gpus": 0}
    assert sum(b["g"] for b in bundles) <= 1  # the bundles fit one pod's group resource


def test_pipeline_over_two_nodes_packs_sixteen_bundles_over_two_pods():
    model = _model(tensor_parallel_size=8, pipeline_parallel_size=2, replicas=_gpus(16, 2))
    placement = replica_placement(model, group_resource="g")
    bundles = placement["placement_group_bundles"]
    assert len(bundles) == 16 and placement["placement_group_strategy"] == "PACK"
    assert sum(b["g"] for b in bundles) == pytest.approx(2)  # exactly two pods' worth


def test_group_share_rounds_down_so_odd_gpu_counts_still_fit_a_pod():
    model = _model(tensor_parallel_size=6, replicas=_gpus(6))
    bundles = replica_placement(model, group_resource="g")["placement_group_bundles"]
    assert bundles[0]["g"] == 0.1666 and sum(b["g"] for b in bundles) <= 1


def test_ray_serve_accepts_the_placement_options():
    """Ray Serve's own option validation (bundles vs. the replica actor's resources)."""
    pytest.importorskip("ray.serve")
    from agentserve.serve.app import deployment_options
    from ray import serve

    model = {"name": "m", "source": "/models/m", "tensor_parallel_size": 4, "replicas": _gpus(4)}
    spec = spec_from_dict({"models": [model]})
    options = deployment_options(spec.models[0], spec)
    assert len(options["placement_group_bundles"]) == 4

    @serve.deployment
    class Probe:
        pass

    deployment = Probe.options(**options)
    assert deployment._deployment_config is not None
    assert deployment._replica_config.placement_group_bundles == options["placement_group_bundles"]

"""Multi-GPU replicas: vLLM's config is made inside the replica's Ray placement group and
carries it to vLLM's Ray executor. Real Ray (a local cluster with logical GPUs); the engine
args are a stand-in whose create_engine_config records where it ran."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from agentserve.engine.vllm_ray import (
    PlacementGroupMissingError,
    config_in_placement_group,
    needs_placement_group,
)

ray = pytest.importorskip("ray")


@pytest.mark.parametrize(
    ("kwargs", "needs"),
    [
        ({"tensor_parallel_size": 1, "pipeline_parallel_size": 1}, False),
        ({"tensor_parallel_size": 8, "distributed_executor_backend": "ray"}, True),
        ({"tensor_parallel_size": 8, "pipeline_parallel_size": 2,
          "distributed_executor_backend": "ray"}, True),
        ({"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}, False),
    ],
)  # fmt: skip
def test_which_engines_need_the_placement_group(kwargs, needs):
    assert needs_placement_group(kwargs) is needs


def _stand_in_args():
    def create_engine_config(usage_context):
        import ray as worker_ray

        ctx = worker_ray.get_runtime_context()
        return SimpleNamespace(
            parallel_config=SimpleNamespace(placement_group=None),
            usage=str(usage_context),
            gpus=ctx.get_assigned_resources().get("GPU", 0),
            group=ctx.get_placement_group_id(),
        )

    return SimpleNamespace(create_engine_config=create_engine_config)


def test_outside_a_placement_group_is_a_clear_error():
    with pytest.raises(PlacementGroupMissingError, match="placement_group_bundles"):
        config_in_placement_group(_stand_in_args())


def test_config_is_made_on_a_gpu_bundle_and_carries_the_group():
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        group = placement_group([{"CPU": 1, "GPU": 1}, {"GPU": 1}], strategy="STRICT_PACK")
        ray.get(group.ready(), timeout=60)

        @ray.remote(num_cpus=1, num_gpus=0)
        def replica():  # like the Serve replica: in bundle 0, holding no GPU
            config = config_in_placement_group(_stand_in_args())
            return config.parallel_config.placement_group.id.hex(), config.gpus, config.group

        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
        )
        carried, task_gpus, task_group = ray.get(
            replica.options(scheduling_strategy=strategy).remote(), timeout=120
        )
        assert carried == group.id.hex() == task_group  # made in the group, handed to vLLM
        assert 0 < task_gpus < 1  # a sliver of a GPU bundle, released afterwards
        remove_placement_group(group)
    finally:
        ray.shutdown()

"""vLLM across a replica's Ray placement group (TP x PP > 1), started as Ray Serve LLM does.

The replica actor holds no GPU (agentserve.placement puts it in the first GPU bundle with
num_gpus 0), so vLLM's config, which queries the device, is created in a Ray task that
borrows a sliver of a GPU inside the replica's placement group; the placement group is
then handed to vLLM's Ray executor, which starts one worker per GPU bundle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PlacementGroupMissingError", "config_in_placement_group", "needs_placement_group"]

CONFIG_TASK_GPUS = 0.001  # Ray Serve LLM's share: schedules on a GPU bundle, takes no GPU


class PlacementGroupMissingError(RuntimeError):
    """A multi-GPU replica runs outside the placement group its deployment should give it."""


def needs_placement_group(engine_kwargs: dict[str, Any]) -> bool:
    """True when vLLM runs more than one worker on the Ray executor."""
    world = engine_kwargs.get("tensor_parallel_size", 1) * engine_kwargs.get(
        "pipeline_parallel_size", 1
    )
    return world > 1 and engine_kwargs.get("distributed_executor_backend") == "ray"


def _create_config(engine_args: Any) -> Any:
    from vllm.usage.usage_lib import UsageContext

    try:
        return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as err:  # vLLM's pydantic errors do not pickle across Ray: keep the text
        raise RuntimeError(f"vLLM engine config: {err}") from None


def config_in_placement_group(engine_args: Any) -> Any:
    """VllmConfig for `engine_args`, created on a GPU of the current placement group, with
    that placement group set for vLLM's Ray executor (blocking: call it off the event loop)."""
    import ray
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from vllm.platforms import current_platform

    group = get_current_placement_group() if ray.is_initialized() else None
    if group is None:
        raise PlacementGroupMissingError(
            "tensor_parallel_size x pipeline_parallel_size > 1 needs the replica to run in its "
            "Ray placement group (Serve option placement_group_bundles, from "
            "agentserve.placement); none is current"
        )
    task = ray.remote(_create_config).options(
        num_cpus=0,
        num_gpus=CONFIG_TASK_GPUS,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group),
    )
    config = ray.get(task.remote(engine_args))
    config.parallel_config.placement_group = group
    # the device capability cached before the GPU was visible here would be wrong
    if hasattr(current_platform.get_device_capability, "cache_clear"):
        current_platform.get_device_capability.cache_clear()
    return config

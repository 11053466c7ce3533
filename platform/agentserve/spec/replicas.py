"""ReplicaSpec: a model deployment's replica bounds, per-replica resources and Kubernetes
placement (TolerationSpec), health checks and graceful shutdown."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agentserve.spec.base import _Spec


class TolerationSpec(_Spec):
    """A Kubernetes toleration for replica pods (null key/effect match all)."""

    key: str | None = Field(None, description="Taint key.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="How value is matched.")
    value: str | None = Field(None, description="Taint value, for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute grace seconds.")


class ReplicaSpec(_Spec):
    """Replica bounds and per-replica resources for one model deployment."""

    min_replicas: int = Field(1, ge=0, description="Fewest replicas; 0 allows scale to zero.")
    max_replicas: int = Field(1, ge=1, description="Most replicas.")
    initial_replicas: int | None = Field(None, ge=0, description="Replicas at start; null = min.")
    num_gpus: int = Field(0, ge=0, description="GPUs per replica: 0 on CPU, 1 on GPU.")
    num_cpus: float = Field(2.0, gt=0, description="CPU cores per replica.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Kubernetes node labels replica pods require."
    )
    tolerations: list[TolerationSpec] = Field(
        default_factory=list, description="Kubernetes tolerations for replica pods."
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Kubernetes affinity of replica pods (a core/v1 Affinity, as is).",
    )
    gpu_resource_name: str = Field(
        "nvidia.com/gpu",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Kubernetes extended resource replica pods request their GPUs as: "
        "nvidia.com/gpu, a MIG slice (nvidia.com/mig-3g.40gb) or another vendor's "
        "(amd.com/gpu).",
    )
    extra_resources: dict[str, str] = Field(
        default_factory=dict,
        description="Further extended resources each replica pod requests (and limits), "
        "e.g. {rdma/rdma_shared_device_a: '1'} for InfiniBand/RoCE between the nodes of a "
        "multi-node replica (NCCL).",
    )
    ipc_lock: bool = Field(
        False,
        description="Add the IPC_LOCK capability to replica containers (RDMA memory "
        "registration for NCCL over InfiniBand/RoCE). Kubernetes gives added capabilities "
        "to root processes only: the agentserve images run Ray as uid 1000, where this has "
        "no effect; NCCL then gets the locked-memory limit (RLIMIT_MEMLOCK) the container "
        "runtime sets (check `ulimit -l` in a replica pod: NCCL wants unlimited). Useful "
        "only with an image that runs Ray as root.",
    )
    health_check_period_s: float = Field(
        10.0, gt=0, description="Seconds between engine health checks of a replica."
    )
    health_check_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds a health check may take; 3 failed or late checks in a row "
        "and the replica is replaced (a stuck engine).",
    )
    graceful_shutdown_timeout_s: float = Field(
        120.0,
        ge=0,
        description="Seconds a stopping replica (scale-down, update, shutdown) lets its "
        "in-flight requests finish before it is killed (then they migrate).",
    )
    graceful_shutdown_wait_loop_s: float = Field(
        1.0, gt=0, description="Seconds between a stopping replica's in-flight checks."
    )
    nodes_per_replica: int = Field(
        1,
        ge=1,
        le=64,
        description="Nodes (worker pods) one replica spans: 1 = all its num_gpus on one node; "
        "more splits its pipeline stages over that many nodes of num_gpus / nodes_per_replica "
        "GPUs each (pipeline_parallel_size must be a multiple of it).",
    )
    sleep_when_idle_s: float | None = Field(
        None,
        gt=0,
        description="GPU replicas only: after this many seconds without a request, a "
        "replica puts its vLLM engine to sleep (level 1: weights offloaded to CPU RAM, KV "
        "cache freed) and wakes it on its next request, which waits for the wake (seconds, "
        "not a replica start). Meant for autoscaling.standby_replicas: the margin idles "
        "asleep and wakes when a burst reaches it. Ray routes to every replica, so any "
        "replica idle this long sleeps; null = never. vLLM's CPU build has no sleep mode.",
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> ReplicaSpec:
        low, high, initial = self.min_replicas, self.max_replicas, self.initial_replicas
        if low > high:
            raise ValueError(f"min_replicas ({low}) must be <= max_replicas ({high})")
        if initial is not None and not low <= initial <= high:
            raise ValueError(f"initial_replicas ({initial}) must lie in [{low}, {high}]")
        if self.sleep_when_idle_s is not None and self.num_gpus == 0:
            raise ValueError(
                "sleep_when_idle_s needs GPU replicas (num_gpus >= 1): vLLM's sleep mode is "
                "CUDA only and its CPU build has none; remove it for CPU replicas"
            )
        return self

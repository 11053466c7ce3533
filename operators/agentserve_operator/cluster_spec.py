"""Sub-blocks of the `kubernetes` object (KubernetesSpec, resource.py): the volumes the Ray
pods mount, and how a Ray cluster is upgraded and kept up (incremental upgrades, GCS fault
tolerance).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "UPGRADE_STRATEGIES",
    "GcsFaultToleranceSpec",
    "HubCacheSpec",
    "IncrementalUpgradeSpec",
    "ModelVolumeSpec",
]

UPGRADE_STRATEGIES = ("auto", "None", "NewCluster", "NewClusterWithIncrementalUpgrade")
UpgradeStrategy = Literal["auto", "None", "NewCluster", "NewClusterWithIncrementalUpgrade"]


class _K8s(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelVolumeSpec(_K8s):
    """A PersistentVolumeClaim with model weights (and drafters), mounted into every Ray pod."""

    claim_name: str = Field(max_length=253, description="PersistentVolumeClaim name.")
    mount_path: str = Field(
        "/models",
        pattern=r"^/",
        description="Absolute mount path; model.source and drafter.path point below it.",
    )
    read_only: bool = Field(True, description="Mount read-only.")


class HubCacheSpec(_K8s):
    """A PersistentVolumeClaim holding the Hugging Face cache (HF_HOME) of every Ray pod:
    Hugging Face id sources are downloaded into it once and shared by all replicas."""

    claim_name: str = Field(max_length=253, description="PersistentVolumeClaim name.")
    mount_path: str = Field(
        "/hf-cache", pattern=r"^/", description="Absolute mount path; HF_HOME is set to it."
    )


class IncrementalUpgradeSpec(_K8s):
    """KubeRay's NewClusterWithIncrementalUpgrade (KubeRay >= 1.5, its
    RayServiceIncrementalUpgrade feature gate on, Gateway API CRDs and a Gateway controller
    installed): the new Ray cluster grows in steps of max_surge_percent of the serving
    capacity while traffic moves to it through a Gateway KubeRay makes (<name>-gateway) and
    the old cluster shrinks, so the GPUs in use stay within (100 + max_surge_percent)%."""

    gateway_class_name: str = Field(
        min_length=1,
        max_length=253,
        description="GatewayClass (installed by the cluster admin, e.g. istio) of the Gateway "
        "KubeRay creates for the RayService: the endpoint during and after upgrades.",
    )
    max_surge_percent: int = Field(
        25,
        ge=1,
        le=100,
        description="Capacity the new cluster gains per step, in percent of the serving "
        "capacity (100 = a full second cluster at once, as NewCluster).",
    )
    step_size_percent: int = Field(
        10, ge=1, le=100, description="Traffic moved to the new cluster per interval, percent."
    )
    interval_s: int = Field(30, ge=1, le=3600, description="Seconds between two traffic steps.")


class GcsFaultToleranceSpec(_K8s):
    """Ray GCS fault tolerance with an external Redis (KubeRay gcsFaultToleranceOptions):
    the head pod's GCS state survives its restart, so workers and Serve replicas keep
    running and serving while the head comes back (without it, a head restart restarts
    every worker: every model reloads)."""

    redis_address: str = Field(
        min_length=1,
        max_length=1024,
        description="Redis address, host:port (e.g. redis.redis.svc:6379); rediss:// for TLS.",
    )
    redis_password_secret: str | None = Field(
        None,
        max_length=253,
        description="Secret in the same namespace holding the Redis password (key "
        "redis_password_key); it needs the allow-reference label like every referenced "
        "Secret. null = no password.",
    )
    redis_password_key: str = Field(
        "password", min_length=1, max_length=253, description="Key of the password in it."
    )
    external_storage_namespace: str | None = Field(
        None,
        max_length=253,
        description="Key prefix of this deployment's state in Redis (KubeRay's default: the "
        "RayCluster's UID, which a RayService upgrade changes).",
    )

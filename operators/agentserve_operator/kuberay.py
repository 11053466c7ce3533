"""KubeRay versions the operator renders for, and which one a cluster runs (read from the
installed RayService CRD's schema, or named by `kubernetes.kuberay_version`).

Supported (docs/kubernetes.md, "Supported KubeRay versions"):

| KubeRay | RayService schema                          | what the operator renders           |
|---------|--------------------------------------------|-------------------------------------|
| 1.4.x   | no rayClusterConfig.authOptions            | no Ray token auth (NetworkPolicy)    |
| 1.5.x   | authOptions, upgradeStrategy.clusterUpgradeOptions | token auth; incremental upgrade |
| 1.6.x   | authOptions, rayClusterConfig.upgradeStrategy | token auth                         |

Anything older is refused with a message naming the versions above: a RayService CRD without
rayClusterConfig.autoscalerOptions.version, the one field KubeRay 1.4 added to it outside pod
templates (1.3 already has spec.upgradeStrategy, so that field cannot tell them apart).
A newer KubeRay whose CRD has every 1.6 field is rendered for as 1.6 (ray.io/v1 only ever
gains optional fields).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DEFAULT",
    "DETECT_TTL_S",
    "RAYSERVICE_CRD",
    "SUPPORTED",
    "Detector",
    "KubeRay",
    "UnsupportedKubeRay",
    "from_crd",
    "resolve",
]

RAYSERVICE_CRD = "rayservices.ray.io"
SUPPORTED: tuple[str, ...] = ("1.4", "1.5", "1.6")
DEFAULT = "1.6"  # no RayService CRD readable: render for the newest (apply then names why)
DETECT_TTL_S = 600.0  # how long a detected KubeRay version is trusted (upgrades under us)
Version = Literal["1.4", "1.5", "1.6"]
UPGRADE_TYPES: dict[str, tuple[str, ...]] = {
    # RayService spec.upgradeStrategy.type values KubeRay's controller accepts (the CRD
    # types it as any string; utils/validation.go ValidateRayServiceSpec); 1.5 adds
    # NewClusterWithIncrementalUpgrade with spec.upgradeStrategy.clusterUpgradeOptions
    "1.4": ("NewCluster", "None"),
    "1.5": ("NewCluster", "None", "NewClusterWithIncrementalUpgrade"),
    "1.6": ("NewCluster", "None", "NewClusterWithIncrementalUpgrade"),
}


class UnsupportedKubeRay(ValueError):
    """The installed (or named) KubeRay is one the operator cannot render for."""


@dataclass(frozen=True)
class KubeRay:
    """What the RayService CRD of one supported KubeRay version accepts."""

    version: Version

    @property
    def auth_options(self) -> bool:
        """rayClusterConfig.authOptions (Ray token auth) exists: KubeRay >= 1.5."""
        return self.version != "1.4"

    @property
    def incremental_upgrade(self) -> bool:
        """upgradeStrategy NewClusterWithIncrementalUpgrade (clusterUpgradeOptions) exists:
        KubeRay >= 1.5."""
        return "NewClusterWithIncrementalUpgrade" in UPGRADE_TYPES[self.version]


def resolve(named: str | None, crd: dict[str, Any] | None) -> KubeRay:
    """The KubeRay to render for: `named` (kubernetes.kuberay_version) wins over the
    installed CRD; neither -> DEFAULT. Raises UnsupportedKubeRay."""
    if named is not None:
        return KubeRay(_check(named))
    if crd is None:
        return KubeRay(DEFAULT)  # type: ignore[arg-type]
    return from_crd(crd)


def from_crd(crd: dict[str, Any]) -> KubeRay:
    """The supported KubeRay whose RayService schema `crd` (the installed
    CustomResourceDefinition rayservices.ray.io) matches; raises UnsupportedKubeRay."""
    spec = _v1_spec_properties(crd) or {}
    cluster = (spec.get("rayClusterConfig") or {}).get("properties") or {}
    autoscaler = (cluster.get("autoscalerOptions") or {}).get("properties") or {}
    if "upgradeStrategy" not in spec or "version" not in autoscaler:
        raise UnsupportedKubeRay(
            "the installed KubeRay is older than 1.4 (its RayService CRD has no ray.io/v1 "
            "spec.rayClusterConfig.autoscalerOptions.version): install KubeRay "
            f"{', '.join(SUPPORTED)} (see docs/kubernetes.md, Supported KubeRay versions)"
        )
    if "authOptions" not in cluster:
        return KubeRay("1.4")
    return KubeRay("1.6" if "upgradeStrategy" in cluster else "1.5")


class Detector:
    """The installed KubeRay, detected from the RayService CRD (about 1 MB to fetch and
    parse) at most once per `ttl_s`, not on every reconcile of every CR: a KubeRay upgraded
    under the running operator is seen within `ttl_s`, or at once when an apply finds the
    schema changed (`forget`, called on SchemaMismatch). An unsupported one is remembered
    as well; an absent CRD (KubeRay not installed yet) and a failed read (API error) are
    not: the next call reads again."""

    def __init__(self, read_crd: Callable[[str], dict[str, Any] | None],
                 ttl_s: float = DETECT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._read_crd = read_crd
        self._ttl_s = ttl_s
        self._clock = clock
        self._at: float | None = None
        self._found: KubeRay | str = KubeRay(DEFAULT)  # str: why it is unsupported

    def installed(self) -> KubeRay:
        """The KubeRay to render for (DEFAULT without a readable CRD); raises
        UnsupportedKubeRay."""
        now = self._clock()
        if self._at is None or now - self._at >= self._ttl_s:
            crd = self._read_crd(RAYSERVICE_CRD)
            try:
                self._found = resolve(None, crd)
            except UnsupportedKubeRay as err:
                self._found = str(err)
            # no CRD yet: render for DEFAULT, and read again next time (KubeRay installed
            # after the operator must not get DEFAULT's fields for a whole TTL)
            self._at = now if crd is not None else None
        if isinstance(self._found, str):
            raise UnsupportedKubeRay(self._found)
        return self._found

    def forget(self) -> None:
        """Read the CRD again on the next call: the API server refused a field the detected
        version has (KubeRay replaced under the operator)."""
        self._at = None


def _check(named: str) -> Version:
    short = ".".join(named.lstrip("v").split(".")[:2])
    if short not in SUPPORTED:
        raise UnsupportedKubeRay(
            f"kubernetes.kuberay_version {named!r} is not supported: use one of "
            f"{', '.join(SUPPORTED)} (see docs/kubernetes.md, Supported KubeRay versions)"
        )
    return short  # type: ignore[return-value]


def _v1_spec_properties(crd: dict[str, Any]) -> dict[str, Any] | None:
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") == "v1" and version.get("served", True):
            schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
            return ((schema.get("properties") or {}).get("spec") or {}).get("properties")
    return None

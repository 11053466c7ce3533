"""How a RayService is upgraded when a change under its Ray cluster needs new pods: the
RayService's spec.upgradeStrategy for the installed KubeRay, and the checks that refuse a
strategy the cluster cannot carry out (a ReadWriteOnce hub cache with two clusters at once).

What each strategy costs (docs/kubernetes.md, Upgrades):

| strategy                         | KubeRay | GPUs during an upgrade     | the change       |
|----------------------------------|---------|----------------------------|------------------|
| None                             | 1.4+    | unchanged                  | waits: recreate  |
| NewCluster                       | 1.4+    | 2x (a full second cluster) | no downtime      |
| NewClusterWithIncrementalUpgrade | 1.5+    | (100 + max_surge_percent)% | no downtime      |

`auto` (the default) never doubles the GPUs: incremental where KubeRay >= 1.5 and
kubernetes.incremental_upgrade names a GatewayClass, else None. KubeRay without its
RayServiceIncrementalUpgrade feature gate treats NewClusterWithIncrementalUpgrade as None
(rayservice_controller.go, isZeroDowntimeUpgradeEnabled, v1.5.2 and v1.6.2).
"""

from __future__ import annotations

from typing import Any

from agentserve_operator import kuberay as kr
from agentserve_operator import resource as r

__all__ = ["TWO_CLUSTER_STRATEGIES", "check_upgrade", "strategy_type", "upgrade_strategy"]

INCREMENTAL = "NewClusterWithIncrementalUpgrade"
# strategies that run the old and the new Ray cluster's workers at the same time
TWO_CLUSTER_STRATEGIES = frozenset({"NewCluster", INCREMENTAL})
_SINGLE_NODE_MODES = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})


def strategy_type(kube: r.KubernetesSpec, kuberay: kr.KubeRay) -> str:
    """The upgradeStrategy.type rendered for `kube.upgrade_strategy` on `kuberay`."""
    if kube.upgrade_strategy != "auto":
        return kube.upgrade_strategy
    if kuberay.incremental_upgrade and kube.incremental_upgrade is not None:
        return INCREMENTAL
    return "None"


def upgrade_strategy(kube: r.KubernetesSpec, kuberay: kr.KubeRay) -> dict[str, Any]:
    """RayService spec.upgradeStrategy: the type, and for an incremental upgrade its
    clusterUpgradeOptions (all four fields: the CRD requires three, KubeRay's default
    surge is 100%, a full second cluster)."""
    kind = strategy_type(kube, kuberay)
    out: dict[str, Any] = {"type": kind}
    if kind == INCREMENTAL and kube.incremental_upgrade is not None:
        inc = kube.incremental_upgrade
        out["clusterUpgradeOptions"] = {
            "gatewayClassName": inc.gateway_class_name,
            "maxSurgePercent": inc.max_surge_percent,
            "stepSizePercent": inc.step_size_percent,
            "intervalSeconds": inc.interval_s,
        }
    return out


def check_upgrade(kube: r.KubernetesSpec, kuberay: kr.KubeRay,
                  hub_cache_claim: dict[str, Any] | None) -> None:  # fmt: skip
    """Raise InvalidResource when the upgrade strategy cannot work here: incremental on a
    KubeRay older than 1.5 or without incremental_upgrade, or two clusters at once over a
    hub cache claim (`hub_cache_claim`: the PersistentVolumeClaim as read) that only one
    node can mount (Multi-Attach: the new cluster's workers never start, the upgrade never
    completes)."""
    kind = strategy_type(kube, kuberay)
    problems = []
    if kind == INCREMENTAL and not kuberay.incremental_upgrade:
        problems.append(("kubernetes.upgrade_strategy",
                         f"{INCREMENTAL} needs KubeRay >= 1.5 (installed: {kuberay.version}); "
                         "use None or NewCluster"))  # fmt: skip
    if kind == INCREMENTAL and kube.incremental_upgrade is None:
        problems.append(("kubernetes.incremental_upgrade",
                         f"required by {INCREMENTAL} (gateway_class_name at least)"))  # fmt: skip
    modes = set(((hub_cache_claim or {}).get("spec") or {}).get("accessModes") or [])
    if kind in TWO_CLUSTER_STRATEGIES and modes and modes <= _SINGLE_NODE_MODES:
        claim = kube.hub_cache.claim_name if kube.hub_cache else "?"
        problems.append(("kubernetes.hub_cache",
                         f"claim {claim!r} is {'/'.join(sorted(modes))}, but upgrade strategy "
                         f"{kind} runs a second Ray cluster's workers beside the first, on "
                         "other nodes (Multi-Attach): use a ReadWriteMany claim, or "
                         "kubernetes.upgrade_strategy None"))  # fmt: skip
    if problems:
        lines = [f"  {field}: {msg}" for field, msg in problems]
        raise r.InvalidResource("\n".join(["invalid AgentServe:", *lines]), problems)

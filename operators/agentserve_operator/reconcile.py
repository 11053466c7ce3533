"""One level-based reconcile of an AgentServe: observe -> plan -> apply -> patch status.

Talks to the cluster only through the `Cluster` port (k8s.KubeCluster in production,
fake.FakeCluster in tests). Safe to run any number of times: a second run applies nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentserve_operator import kuberay as kr
from agentserve_operator import manifests as m
from agentserve_operator import resource as r
from agentserve_operator.key_salt import ensure_salt, head_pods_have_salt
from agentserve_operator.plan import Action, ObjectRef, plan
from agentserve_operator.references import check_references
from agentserve_operator.serve_probe import status_url
from agentserve_operator.status import Observation, active_cluster, compute_status, invalid_status
from agentserve_operator.upgrade import check_upgrade

__all__ = [
    "Cluster",
    "ClusterError",
    "ReconcileResult",
    "RetriableClusterError",
    "SchemaMismatch",
    "reconcile",
]

MONITORING_CRD = "servicemonitors.monitoring.coreos.com"
ServeReader = Callable[[str], "dict[str, Any] | None"]  # URL -> Serve's /status body


class ClusterError(Exception):
    """The API refused a request in a way retrying will not fix (e.g. 422, 403)."""


class RetriableClusterError(ClusterError):
    """A transient API failure (connection, 5xx, 429, 409 conflict): retry with backoff."""


class SchemaMismatch(ClusterError):
    """The API server refused a field the object's CRD does not define (strict field
    validation, 422 "unknown field"): the operator rendered for another KubeRay version."""


class Cluster(Protocol):
    """The operator's whole view of the Kubernetes API."""

    def get(self, ref: ObjectRef) -> dict[str, Any] | None: ...
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    # create only (409 when it exists: RetriableClusterError)
    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    def delete(self, ref: ObjectRef) -> None: ...
    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]: ...
    # decoded data, None when absent; InvalidResource when a value is not UTF-8 text
    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None: ...
    def crd_exists(self, name: str) -> bool: ...
    def read_crd(self, name: str) -> dict[str, Any] | None: ...
    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...
    def post_event(self, cr: dict[str, Any], kind: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class ReconcileResult:
    """What a reconcile did: the actions applied and the status written."""

    actions: list[Action]
    status: dict[str, Any]
    error: r.InvalidResource | None = None


def load_desired(cluster: Cluster, cr: dict[str, Any], *, salted: bool = True) -> r.Desired:
    """Validate the CR, with tenant keys from its Secret, hashed with the CR's salt when
    `salted` (key_salt.py); raises InvalidResource, also for a Secret or claim it may not
    reference (references.py)."""
    namespace = cr["metadata"].get("namespace", "default")
    kube = r.kube_spec_of(cr)
    check_references(cluster, namespace, kube)
    secret = kube.api_key_secret
    data = cluster.read_secret(namespace, secret) if secret else None
    salt = ensure_salt(cluster, cr)  # always: the head pod's environment names it
    return r.desired_from_cr(cr, data, key_salt=salt if salted else None)


def _candidate_refs(d: r.Desired) -> list[ObjectRef]:
    """Every child this CR may own, desired now or not (for stale deletion)."""
    kinds = [(m.KINDS[role], name) for role, name in m.names(d.name).items()]
    return [ObjectRef(m.API_VERSIONS[kind], kind, d.namespace, name) for kind, name in kinds]


def observe(cluster: Cluster, d: r.Desired, monitoring: bool) -> dict[ObjectRef, dict[str, Any]]:
    """Current copies of the CR's possible children (absent ones left out); the Prometheus
    operator's kinds are looked up only when `monitoring` (their CRD exists: a kind the API
    server does not know makes the dynamic client rerun API discovery on every lookup)."""
    observed = {}
    for ref in _candidate_refs(d):
        if ref.api_version.startswith("monitoring.coreos.com/") and not monitoring:
            continue
        obj = cluster.get(ref)
        if obj is not None:
            observed[ref] = obj
    return observed


def _apply(cluster: Cluster, actions: list[Action]) -> None:
    for action in actions:
        if action.verb == "apply":
            assert action.obj is not None
            cluster.apply(action.obj)
        else:
            cluster.delete(action.ref)


def _apply_rendered(cluster: Cluster, actions: list[Action],
                    detector: kr.Detector | None) -> None:  # fmt: skip
    """_apply; on SchemaMismatch the detected KubeRay is forgotten (read again on the retry,
    not after its TTL) and the failure is retriable."""
    try:
        _apply(cluster, actions)
    except SchemaMismatch as err:
        if detector is not None:
            detector.forget()
        raise RetriableClusterError(f"{err}; re-reading the installed KubeRay version") from err


def _reject(cluster: Cluster, cr: dict[str, Any], err: r.InvalidResource,
            previous: list[dict[str, Any]], now: str) -> ReconcileResult:  # fmt: skip
    meta = cr["metadata"]
    status = invalid_status(int(meta.get("generation", 1)), str(err), previous, now)
    old = next((c for c in previous if c.get("type") == "Degraded"), {})
    if old.get("message") != str(err):  # one Event per distinct problem, not per retry
        cluster.post_event(cr, "Warning", "InvalidSpec", str(err))
    cluster.patch_status(meta.get("namespace", "default"), meta["name"], status)
    return ReconcileResult([], status, err)


def reconcile(cluster: Cluster, cr: dict[str, Any], now: str,
              kuberay: kr.Detector | None = None,
              read_serve: ServeReader | None = None) -> ReconcileResult:  # fmt: skip
    """Bring the cluster to the CR's spec and write its status; `now` is RFC 3339 UTC;
    `kuberay` detects the installed KubeRay (the operator shares one, which caches it;
    None: read the CRD now); `read_serve` reads Serve's status from a URL
    (serve_probe.fetch_status; None: not read, status falls back on pods and KubeRay).

    An invalid spec leaves the running children untouched and is reported in status and an
    Event (the result carries the error). API failures raise ClusterError.
    """
    previous = ((cr.get("status") or {}).get("conditions")) or []
    meta = cr["metadata"]
    pods = cluster.list_pods(meta.get("namespace", "default"), {m.LABEL_DEPLOYMENT: meta["name"]})
    try:
        d = load_desired(cluster, cr, salted=head_pods_have_salt(pods))
        kuberay_version = _kuberay(cluster, d, kuberay)
        check_upgrade(d.kube, kuberay_version, _hub_cache_claim(cluster, d))
    except r.InvalidResource as err:
        return _reject(cluster, cr, err, previous, now)
    monitoring = cluster.crd_exists(MONITORING_CRD)
    desired = m.children(d, monitoring_available=monitoring, kuberay=kuberay_version)
    actions = plan(desired, observe(cluster, d, monitoring), d.uid)
    _apply_rendered(cluster, actions, kuberay)
    rayservice = cluster.get(ObjectRef.of(m.rayservice(d)))
    obs = _observation(d, rayservice, pods, cr.get("status") or {}, read_serve)
    status = compute_status(d, obs, len(actions), previous, now)
    if _changed(cr.get("status") or {}, status):
        cluster.patch_status(d.namespace, d.name, status)
    return ReconcileResult(actions, status)


def _kuberay(cluster: Cluster, d: r.Desired, detector: kr.Detector | None) -> kr.KubeRay:
    """The KubeRay to render for: kubernetes.kuberay_version, else the installed one
    (`detector`'s, cached for its TTL: KubeRay may be upgraded under a running operator).
    An unsupported one is an InvalidResource naming the supported versions."""
    named = d.kube.kuberay_version
    try:
        if named:
            return kr.resolve(named, None)
        return (detector or kr.Detector(cluster.read_crd)).installed()
    except kr.UnsupportedKubeRay as err:
        raise r.InvalidResource(
            f"invalid AgentServe: {err}", [("kubernetes.kuberay_version", str(err))]
        ) from None


def _observation(
    d: r.Desired,
    rayservice: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    old_status: dict[str, Any],
    read_serve: ServeReader | None,
) -> Observation:
    """What status is computed from: Serve's own status read from the active cluster's
    ingress when `read_serve` is given, and the ready replicas the last status showed."""
    url = status_url(d, pods, active_cluster(rayservice)) if read_serve else None
    serve = read_serve(url) if read_serve and url else None
    previous = {x.get("name"): int(x.get("readyReplicas") or 0)
                for x in old_status.get("models") or [] if isinstance(x, dict)}  # fmt: skip
    return Observation(rayservice, pods, serve, previous)


def _hub_cache_claim(cluster: Cluster, d: r.Desired) -> dict[str, Any] | None:
    """The hub cache PersistentVolumeClaim as stored (its accessModes), or None."""
    if d.kube.hub_cache is None:
        return None
    ref = ObjectRef("v1", "PersistentVolumeClaim", d.namespace, d.kube.hub_cache.claim_name)
    return cluster.get(ref)


def _changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items())

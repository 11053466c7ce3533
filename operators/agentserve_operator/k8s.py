"""The one module that talks to the Kubernetes API: the Cluster port over the official client.

Objects are written with server-side apply (field manager `agentserve-operator`, conflicts
forced: the operator owns what it sets). API failures become RetriableClusterError
(connection errors, 409, 429, 5xx) or ClusterError (anything else).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError, ResourceNotFoundError
from urllib3.exceptions import HTTPError

from agentserve_operator import resource as r
from agentserve_operator.plan import ObjectRef
from agentserve_operator.reconcile import ClusterError, RetriableClusterError, SchemaMismatch

__all__ = ["KubeCluster", "load_config"]

_RETRIABLE = {409, 429, 500, 502, 503, 504}
# objects applied with strict field validation: a field their CRD lacks is a 422, not
# silently pruned (which would re-apply it every resync for ever); their schema depends on
# the KubeRay version installed (kuberay.py)
_STRICT_GROUPS = ("ray.io/",)


def load_config() -> client.ApiClient:
    """In-cluster config when running in a pod, else the local kubeconfig."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _translate(err: Exception, what: str) -> ClusterError:
    status = getattr(err, "status", None)
    body = str(getattr(err, "body", "") or "")
    if status == 422 and "unknown field" in body:
        return SchemaMismatch(f"{what}: {status} {body[:500]}")
    if isinstance(err, HTTPError) or status in _RETRIABLE:
        return RetriableClusterError(f"{what}: {status or ''} {err}".strip())
    return ClusterError(f"{what}: {status} {getattr(err, 'reason', err)}")


class KubeCluster:
    """Cluster port over a kubernetes ApiClient (see reconcile.Cluster for the contract)."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or load_config()
        self.dynamic = DynamicClient(self.api)
        self.core = client.CoreV1Api(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        try:
            res = self._resource(ref.api_version, ref.kind)
            return res.get(name=ref.name, namespace=ref.namespace).to_dict()
        except (NotFoundError, ResourceNotFoundError):
            return None
        except (DynamicApiError, ApiException, HTTPError) as err:
            raise _translate(err, f"get {ref.kind}/{ref.name}") from None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(obj)
        try:
            res = self._resource(ref.api_version, ref.kind)
            strict = ref.api_version.startswith(_STRICT_GROUPS)
            out = self.dynamic.server_side_apply(
                res, body=obj, namespace=ref.namespace,
                field_manager=r.FIELD_MANAGER, force_conflicts=True,
                query_params=[("fieldValidation", "Strict")] if strict else [],
            )  # fmt: skip
            return out.to_dict()
        except ResourceNotFoundError as err:  # the CRD (e.g. KubeRay's) is not installed
            raise RetriableClusterError(f"apply {ref.kind}: {err}; is its CRD installed?") from None
        except (DynamicApiError, ApiException, HTTPError) as err:
            raise _translate(err, f"apply {ref.kind}/{ref.name}") from None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(obj)
        try:
            res = self._resource(ref.api_version, ref.kind)
            return res.create(body=obj, namespace=ref.namespace).to_dict()
        except (DynamicApiError, ApiException, HTTPError) as err:
            raise _translate(err, f"create {ref.kind}/{ref.name}") from None

    def delete(self, ref: ObjectRef) -> None:
        try:
            res = self._resource(ref.api_version, ref.kind)
            res.delete(name=ref.name, namespace=ref.namespace)
        except (NotFoundError, ResourceNotFoundError):
            return
        except (DynamicApiError, ApiException, HTTPError) as err:
            raise _translate(err, f"delete {ref.kind}/{ref.name}") from None

    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=labels)
        except (ApiException, HTTPError) as err:
            raise _translate(err, "list pods") from None
        return [self.api.sanitize_for_serialization(p) for p in pods.items]

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise _translate(err, f"read Secret/{name}") from None
        except HTTPError as err:
            raise _translate(err, f"read Secret/{name}") from None
        return r.secret_text(name, secret.data)

    def crd_exists(self, name: str) -> bool:
        try:
            self.ext.read_custom_resource_definition(name)
            return True
        except ApiException as err:
            if err.status in (403, 404):  # not installed, or not ours to see
                return False
            raise _translate(err, f"read CRD {name}") from None
        except HTTPError as err:
            raise _translate(err, f"read CRD {name}") from None

    def read_crd(self, name: str) -> dict[str, Any] | None:
        """The CustomResourceDefinition `name` as a plain dict; None when absent or not
        ours to read."""
        try:
            crd = self.ext.read_custom_resource_definition(name)
        except ApiException as err:
            if err.status in (403, 404):
                return None
            raise _translate(err, f"read CRD {name}") from None
        except HTTPError as err:
            raise _translate(err, f"read CRD {name}") from None
        return self.api.sanitize_for_serialization(crd)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        api = client.CustomObjectsApi(self.api)
        try:
            api.patch_namespaced_custom_object_status(
                r.GROUP, r.VERSION, namespace, r.PLURAL, name, {"status": status}
            )
        except (ApiException, HTTPError) as err:
            raise _translate(err, f"patch status {name}") from None

    def post_event(self, cr: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = cr["metadata"]
        now = dt.datetime.now(dt.UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.",
                                         namespace=meta.get("namespace", "default")),
            involved_object=client.V1ObjectReference(
                api_version=r.API_VERSION, kind=r.KIND, name=meta["name"],
                namespace=meta.get("namespace"), uid=meta.get("uid"),
            ),
            type=kind, reason=reason, message=message[:1024],
            first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=r.FIELD_MANAGER),
        )  # fmt: skip
        try:
            self.core.create_namespaced_event(meta.get("namespace", "default"), event)
        except (ApiException, HTTPError) as err:
            raise _translate(err, "post event") from None

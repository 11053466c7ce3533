"""The held-requests board (serve/held_board.py) on Ray: Ray's GCS key-value store. The
ingress writes it (serve/app.py), the SLA policy reads it in Serve's controller
(autoscale/ray_policy.py); every call is bounded by GCS_TIMEOUT_S."""

from __future__ import annotations

from ray import serve

from agentserve.serve.held_board import HELD_SCOPE, HeldStore, sla_scaled_models
from agentserve.spec import DeploymentSpec

__all__ = ["GCS_TIMEOUT_S", "GcsHeldStore", "held_board"]

GCS_TIMEOUT_S = 1.0


class GcsHeldStore:
    """HeldStore on Ray's GCS key-value store (namespace "agentserve"), keys under the
    Serve application `app` (None: the application of the replica it runs in)."""

    NAMESPACE = b"agentserve"

    def __init__(self, app: str | None = None):
        self.app = app

    def _base(self) -> str:
        app = self.app
        if app is None:
            try:
                app = serve.get_replica_context().app_name
            except Exception:  # outside a replica
                app = "default"
        return f"held/{app}/"

    @staticmethod
    def _client():
        from ray.experimental import internal_kv

        client = internal_kv.internal_kv_get_gcs_client()
        if client is None:
            raise RuntimeError("not connected to Ray")
        return client

    def put(self, key: str, value: bytes) -> None:
        key_bytes = (self._base() + key).encode()
        self._client().internal_kv_put(
            key_bytes, value, overwrite=True, namespace=self.NAMESPACE, timeout=GCS_TIMEOUT_S
        )

    def get(self, key: str) -> bytes | None:
        key_bytes = (self._base() + key).encode()
        return self._client().internal_kv_get(
            key_bytes, namespace=self.NAMESPACE, timeout=GCS_TIMEOUT_S
        )

    def keys(self, prefix: str) -> list[str]:
        base = self._base()
        found = self._client().internal_kv_keys(
            (base + prefix).encode(), namespace=self.NAMESPACE, timeout=GCS_TIMEOUT_S
        )
        return [k.decode()[len(base) :] for k in found]

    def delete(self, key: str) -> None:
        key_bytes = (self._base() + key).encode()
        self._client().internal_kv_del(
            key_bytes, del_by_prefix=False, namespace=self.NAMESPACE, timeout=GCS_TIMEOUT_S
        )


def held_board(spec: DeploymentSpec) -> tuple[HeldStore, str] | None:
    """Where the ingress publishes the requests it holds: Ray's GCS store when some model's
    SLA policy reads it (held_board.sla_scaled_models), else None."""
    return (GcsHeldStore(), HELD_SCOPE) if sla_scaled_models(spec) else None

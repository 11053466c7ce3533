"""The held-requests board (serve/held_board.py) on Ray: Ray's GCS key-value store, and
which deployments use it (the SLA policy of autoscaling models)."""

from __future__ import annotations

from ray import serve

from agentserve.serve.held_board import HeldStore
from agentserve.spec import DeploymentSpec, ModelSpec

__all__ = ["HELD_SCOPE", "GcsHeldStore", "held_board"]


class GcsHeldStore:
    """HeldStore on Ray's GCS key-value store (namespace "agentserve"), keys under the
    Serve application's name; stateless, so it pickles to every replica."""

    NAMESPACE = "agentserve"

    def _key(self, key: str) -> bytes:
        try:
            app = serve.get_replica_context().app_name
        except Exception:  # outside a replica
            app = "default"
        return f"held/{app}/{key}".encode()

    def put(self, key: str, value: bytes) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(self._key(key), value, namespace=self.NAMESPACE)

    def get(self, key: str) -> bytes | None:
        from ray.experimental import internal_kv

        return internal_kv._internal_kv_get(self._key(key), namespace=self.NAMESPACE)

    def keys(self, prefix: str) -> list[str]:
        from ray.experimental import internal_kv

        base = self._key("")
        found = internal_kv._internal_kv_list(self._key(prefix), namespace=self.NAMESPACE)
        return [k[len(base) :].decode() for k in found]

    def delete(self, key: str) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(self._key(key), namespace=self.NAMESPACE)


HELD_SCOPE = "requests"  # the board's keys: held/<app>/requests/<model>/<ingress id>


def held_board(
    spec: DeploymentSpec, model: ModelSpec | None = None
) -> tuple[HeldStore, str] | None:
    """Where the ingresses publish the requests they hold (serve/held_board.py): for the
    SLA policy of an autoscaling model (`model`), or of any (the ingress); else None."""
    models = [model] if model is not None else spec.models
    scaled = any(m.replicas.min_replicas < m.replicas.max_replicas for m in models)
    if not scaled or spec.autoscaling.policy != "sla":
        return None
    return GcsHeldStore(), HELD_SCOPE

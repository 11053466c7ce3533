"""Key rotation on a real local Ray Serve (fake engine), deployed declaratively the way
KubeRay does (a Serve config with args + the ingress's user_config): redeploying with a
new key switches the key at the ingress, and the model replica is the same actor."""

from __future__ import annotations

import time

import httpx
import pytest
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve.tenant_config import app_args, ingress_user_config

PORT = 8775
MODEL_DEPLOYMENT = "model-m"


def _config(key: str) -> dict:
    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "replicas": {"num_cpus": 0.1}}],
            "server": {"port": PORT},
            "tenants": [{"name": "alpha", "api_key_sha256": hash_api_key(key), "sla": {}}],
        }
    )
    app = {
        "name": "agentserve",
        "route_prefix": "/",
        "import_path": "agentserve.serve.app:build_app_from_args",
        "args": app_args(spec),
        "deployments": [{"name": "ingress", "user_config": ingress_user_config(spec)}],
    }
    return {"http_options": {"host": "127.0.0.1", "port": PORT}, "applications": [app]}


def _replicas(ray) -> set[str]:
    names = ray.util.list_named_actors(all_namespaces=True)
    return {a["name"] for a in names if "SERVE_REPLICA" in a["name"]}


def _wait_status(key: str, want: int, timeout_s: float = 120.0) -> None:
    deadline, last = time.monotonic() + timeout_s, None
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    while time.monotonic() < deadline:
        try:
            last = httpx.post(
                f"http://127.0.0.1:{PORT}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            ).status_code
        except httpx.HTTPError:
            last = None
        if last == want:
            return
        time.sleep(0.5)
    from ray import serve

    raise AssertionError(f"key {key[:6]}...: status {last}, wanted {want}; {serve.status()}")


def test_rotating_a_key_keeps_the_model_replica():
    ray = pytest.importorskip("ray")
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        client = serve_start(http_options={"host": "127.0.0.1", "port": PORT})
        client.deploy_apps(ServeDeploySchema(**_config("sk-old-key-0123")))
        _wait_status("sk-old-key-0123", 200, timeout_s=480)  # the ingress imports vLLM
        before = _replicas(ray)
        assert any(MODEL_DEPLOYMENT in n for n in before), before
        client.deploy_apps(ServeDeploySchema(**_config("sk-new-key-4567")))
        _wait_status("sk-new-key-4567", 200)
        _wait_status("sk-old-key-0123", 401, timeout_s=10)
        assert _replicas(ray) == before  # no replica (model or ingress) was replaced
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()

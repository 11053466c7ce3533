"""build_app on a real local Ray Serve with the fake engine: handles, streaming, errors."""

from __future__ import annotations

import json

import httpx
import pytest
from agentserve.serve.app import build_app, deployment_options
from agentserve.spec import DeploymentSpec

SPEC = {
    "models": [
        {"name": "org/m:1", "engine": "fake", "max_model_len": 64, "replicas": {"num_cpus": 0.1}}
    ],
    "server": {"port": 8765, "metrics_port": 8766},
}


def test_deployment_options_follow_the_spec():
    spec = DeploymentSpec.model_validate(
        {"models": [{"replicas": {"min_replicas": 1, "max_replicas": 3, "num_gpus": 1}}]}
    )
    options = deployment_options(spec.models[0], spec)
    assert options["name"] == "model-smollm2-135m-instruct"
    assert options["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 1}
    assert options["autoscaling_config"]["max_replicas"] == 3
    assert options["max_queued_requests"] == spec.server.max_queue_len
    fixed = DeploymentSpec().models[0]
    assert deployment_options(fixed, DeploymentSpec())["num_replicas"] == 1


@pytest.fixture(scope="module")
def served():
    ray = pytest.importorskip("ray")
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8765})
    serve.run(build_app(DeploymentSpec.model_validate(SPEC)), route_prefix="/")
    yield "http://127.0.0.1:8765"
    serve.shutdown()
    ray.shutdown()


def test_ray_serve_app_serves_chat_stream_and_errors(served):
    msg = [{"role": "user", "content": "hello ray"}]
    with httpx.Client(base_url=served, timeout=60) as http:
        r = http.post("/v1/chat/completions", json={"model": "org/m:1", "messages": msg})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "echo: hello ray"
        body = {
            "model": "org/m:1",
            "messages": msg,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        r = http.post("/v1/chat/completions", json=body)
        events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        assert events[-1]["usage"]["completion_tokens"] == 3
        long = [{"role": "user", "content": "w " * 80}]
        r = http.post("/v1/chat/completions", json={"model": "org/m:1", "messages": long})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 404  # admin paths: only on metrics_port
    with httpx.Client(base_url="http://127.0.0.1:8766", timeout=60) as admin:
        assert 'agentserve_spec_decode_drafts_total{model="org/m:1"}' in admin.get("/metrics").text
        assert "applications" in admin.get("/status").json()
        assert admin.get("/v1/models").status_code == 404


def test_replica_counts_read_cheaply_agree_with_serve_status(served):
    from agentserve.serve.status import current_status, replica_states

    apps = current_status()["applications"]
    assert apps, "no application"
    for app, info in apps.items():
        for name, dep in info["deployments"].items():
            assert replica_states(app, name) == dep["replicas"], (app, name)
    with httpx.Client(base_url="http://127.0.0.1:8766", timeout=60) as admin:
        text = admin.get("/metrics").text  # the ingress reads the count the cheap way
    assert 'agentserve_replicas_ready{model="org/m:1"} 1.0' in text

"""The operator reads Serve's replica states from the active Ray cluster's ingress
(GET /status on the head pod's admin port) for readyReplicas (issue 62)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentserve.serve.names import deployment_name
from agentserve_operator.reconcile import reconcile
from agentserve_operator.serve_probe import fetch_status, status_url
from test_reconcile import T0, cr

ACTIVE, PENDING = "demo-raycluster-a", "demo-raycluster-b"


def _head(cluster_name: str, ip: str, phase: str = "Running") -> dict:
    labels = {"agentserve.dev/deployment": "demo", "ray.io/cluster": cluster_name,
              "ray.io/node-type": "head"}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{cluster_name}-head", "namespace": "default",
                         "labels": labels},
            "status": {"phase": phase, "podIP": ip}}  # fmt: skip


def test_the_url_is_the_active_clusters_running_head(cluster):
    from agentserve_operator.reconcile import load_desired

    d = load_desired(cluster, cr(cluster))
    pods = [_head(PENDING, "10.0.0.2"), _head(ACTIVE, "10.0.0.1")]
    port = d.spec.server.metrics_port
    assert status_url(d, pods, ACTIVE) == f"http://10.0.0.1:{port}/status"
    assert status_url(d, pods, None) is None
    assert status_url(d, [_head(ACTIVE, "10.0.0.1", phase="Pending")], ACTIVE) is None


def test_reconcile_counts_serves_running_replicas(cluster):
    body = cr(cluster)
    reconcile(cluster, body, T0)
    rs = cluster.find("RayService", "demo")
    rs["status"] = {"activeServiceStatus": {"rayClusterName": ACTIVE}}
    cluster.put(_head(ACTIVE, "10.0.0.1"))
    group = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["groupName"]
    for i in range(2):  # two Ready worker pods: one replica RUNNING, one still loading
        cluster.put({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"w{i}", "namespace": "default", "labels": {
                         "agentserve.dev/deployment": "demo", "ray.io/cluster": ACTIVE,
                         "agentserve.dev/model-group": group}},
                     "status": {"phase": "Running",
                                "conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip
    urls = []

    def read(url):
        urls.append(url)
        states = {"RUNNING": 1, "STARTING": 1}
        deps = {deployment_name("qwen3-8b"): {"status": "UPSCALING", "replicas": states}}
        return {"applications": {"demo": {"status": "RUNNING", "deployments": deps}}}

    result = reconcile(cluster, cluster.find("AgentServe", "demo"), T0, read_serve=read)
    assert urls and urls[0].startswith("http://10.0.0.1:")
    assert result.status["models"][0]["readyReplicas"] == 1


def test_fetch_status_reads_json_and_is_none_on_failure():
    body = {"applications": {}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = json.dumps(body).encode() if self.path == "/status" else b"not json"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert fetch_status(f"{base}/status") == body
        assert fetch_status(f"{base}/other") is None
    finally:
        server.shutdown()
        server.server_close()
    assert fetch_status(base + "/status", timeout_s=0.5) is None  # nothing listens now

"""A real Ray head and worker, started as KubeRay starts the operator's rendered pods and
probed as KubeRay probes them (issue 28, item 1).

Each pod is a network namespace of its own (`unshare`), joined by a veth pair: the pod IP is
the veth address, never a loopback one (with 127.0.0.1 a probe of `localhost` would pass
whatever host the manifest binds). In it: `ray start` with exactly the rendered
rayStartParams, completed as KubeRay's setMissingRayStartParams / generateRayStartCommand do
(v1.5.2, ray-operator/controllers/ray/common/pod.go), run by bash (so `$VAR` expands as in
the pod) with the rendered container environment and KubeRay's token-auth variables; then
KubeRay's probe commands (utils/constant.go) against localhost. Everything runs in a fresh
PID namespace: its processes end with it, and `ray stop` there sees only them.
Needs root with CAP_SYS_ADMIN (network and PID namespaces: tried, not assumed), `ip`, wget
and Ray; skipped otherwise, with the reason. About 30 s; killed (every process of its PID
namespace with it) after RUN_TIMEOUT_S.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agentserve_operator import kuberay as kr
from agentserve_operator import manifests as m
from agentserve_operator.resource import desired_from_cr

HEAD_IP, WORKER_IP = "10.231.0.1", "10.231.0.2"
RUN_TIMEOUT_S = 55  # the whole test stays under a minute
RAY_BIN = Path(sys.executable).parent / "ray"
# KubeRay's exec probes (utils/constant.go: BaseWgetHealthCommand, RayAgentRayletHealthPath,
# RayDashboardGCSHealthPath), timeout 1 s as KubeRay's defaults give them
WGET = "wget --tries 1 -T 1 -q -O- http://localhost:{port}/{path} | grep success"
AGENT_PROBE = WGET.format(port=52365, path="api/local_raylet_healthz")
GCS_PROBE = WGET.format(port=8265, path="api/gcs_healthz")
CR = {
    "apiVersion": "agentserve.dev/v1alpha1",
    "kind": "AgentServe",
    "metadata": {"name": "probe", "namespace": "default", "uid": "u-1"},
    "spec": {
        "models": [{"name": "m", "source": "/models/m", "replicas": {"num_cpus": 1}}],
        "tenants": [
            {
                "name": "t",
                "api_key_sha256": "0" * 64,
                "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50},
            }
        ],
    },
}


def namespaces_unusable() -> str | None:
    """Why this machine cannot run the test (None: it can): the tools, and whether network
    and PID namespaces can really be made (root in a container without CAP_SYS_ADMIN, or
    under a seccomp profile that refuses unshare, cannot)."""
    missing = [t for t in ("unshare", "ip", "wget") if not shutil.which(t)]
    if missing:
        return f"needs {', '.join(missing)}"
    try:
        done = subprocess.run(["unshare", "--net", "--pid", "--fork", "true"],
                              capture_output=True, text=True, timeout=10)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "unshare --net --pid --fork did not finish in 10 s"
    if done.returncode != 0:
        return f"cannot make network and PID namespaces: {done.stderr.strip()[:200]}"
    return None


UNUSABLE = namespaces_unusable()
pytestmark = [
    pytest.mark.skipif(UNUSABLE is not None, reason=str(UNUSABLE)),
    pytest.mark.skipif(not RAY_BIN.exists(), reason="ray not installed"),
]


def ray_start(group: dict, *, head: bool) -> str:
    """The `ray start` command KubeRay builds for `group` (without --block, so the script
    goes on; with the pod IP as node address, which Ray finds itself in a real pod)."""
    params = dict(group["rayStartParams"])
    if head:
        params.setdefault("dashboard-host", "0.0.0.0")
    else:
        params.setdefault("address", f"{HEAD_IP}:6379")
    params.setdefault("metrics-export-port", "8080")
    params.setdefault("dashboard-agent-listen-port", "52365")
    [container] = group["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    params.setdefault("num-cpus", str(int(float(limits["cpu"]))))
    args = " ".join(f"--{k}={v}" for k, v in sorted(params.items()))
    node_ip = HEAD_IP if head else WORKER_IP
    return f"{RAY_BIN} start {'--head ' if head else ''}{args} --node-ip-address={node_ip}"


def pod_env(group: dict, pod_ip: str) -> str:
    """`export` lines for the container's rendered env (fieldRef status.podIP -> pod_ip;
    Secret references left out) plus what KubeRay >= 1.5 adds with authOptions token."""
    [container] = group["template"]["spec"]["containers"]
    lines = ["export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=probe-test-token"]
    for e in container.get("env", []):
        field = (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        value = e.get("value", pod_ip if field == "status.podIP" else None)
        if value is not None:
            lines.append(f"export {e['name']}={shlex.quote(value)}")
    return "\n".join(lines)


def probe_loop(name: str, command: str, tries: int) -> str:
    """Run a probe every second until it passes (print PASS) or `tries` run out (FAIL)."""
    return (
        f"ok=0; for i in $(seq {tries}); do if bash -c {shlex.quote(command)} >/dev/null 2>&1;"
        f" then ok=1; break; fi; sleep 1; done\n"
        f'if [ $ok = 1 ]; then echo "PASS {name}"; else echo "FAIL {name}"; fi'
    )


def script(rayservice: dict, tmp: Path) -> str:
    """The head pod's namespace: veth to the worker's, head, probes, worker, its probes."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    head, [worker] = cluster["headGroupSpec"], cluster["workerGroupSpecs"]
    worker_script = tmp / "worker.sh"
    # the worker waits (at most 10 s) for its end of the veth, which the head's script
    # moves into the worker's namespace once unshare has made it (not before: moved into
    # the pid of an unshare that has not switched yet, the link stays where it was)
    worker_script.write_text(f"""set -u
for i in $(seq 100); do ip link show vw >/dev/null 2>&1 && break; sleep 0.1; done
ip link show vw >/dev/null 2>&1 || {{ echo "FAIL worker-link"; exit 1; }}
ip link set lo up; ip addr add {WORKER_IP}/24 dev vw; ip link set vw up
{pod_env(worker, WORKER_IP)}
{ray_start(worker, head=False)} --temp-dir={tmp}/w >{tmp}/worker.log 2>&1 \
  || echo "FAIL worker-start"
{probe_loop("worker-raylet", AGENT_PROBE, 20)}
{RAY_BIN} stop --force >/dev/null 2>&1
""")
    return f"""set -u
ip link set lo up
ip link add vh type veth peer name vw
ip addr add {HEAD_IP}/24 dev vh; ip link set vh up
{pod_env(head, HEAD_IP)}
cd {tmp}
{ray_start(head, head=True)} --temp-dir={tmp}/h >{tmp}/head.log 2>&1 || echo "FAIL head-start"
{probe_loop("head-gcs", GCS_PROBE, 20)}
{probe_loop("head-raylet", AGENT_PROBE, 5)}
unshare --net bash {worker_script} & pid=$!
here=$(readlink /proc/self/ns/net)
for i in $(seq 100); do
  [ "$(readlink /proc/$pid/ns/net 2>/dev/null)" != "$here" ] && break; sleep 0.1
done
ip link set vw netns $pid || echo "FAIL worker-netns"
wait $pid
{RAY_BIN} stop --force >/dev/null 2>&1
"""


def run_pods(rayservice: dict, tmp: Path) -> str:
    """Run the pods' script in a fresh network and PID namespace. The PID namespace ends
    with its first process (unshare's child; --kill-child kills it when unshare dies) and
    every Ray process goes with it; on timeout the whole process group is killed."""
    body = script(rayservice, tmp)
    cmd = ["unshare", "--net", "--pid", "--kill-child", "--mount-proc", "bash", "-c", body]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\nFAIL timeout after {RUN_TIMEOUT_S} s"
    return out


def rendered(version: str = kr.DEFAULT) -> dict:
    return m.rayservice(desired_from_cr(CR, None), kr.KubeRay(version))


def test_rendered_head_and_worker_answer_kuberays_probes():
    tmp = Path("/tmp") / f"kp-{os.getpid()}"  # short: Ray's unix socket paths
    tmp.mkdir(exist_ok=True)
    try:
        out = run_pods(rendered(), tmp)
        logs = {p.name: p.read_text()[-2000:] for p in tmp.glob("*.log")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert "FAIL" not in out, f"{out}\n{logs}"
    for name in ("head-gcs", "head-raylet", "worker-raylet"):
        assert f"PASS {name}" in out, f"{out}\n{logs}"

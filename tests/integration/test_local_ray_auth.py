"""`agentserve up`'s local Ray cluster (serve/local.start_local's token pin and ray.init) on
a real Ray: a client without the cluster's token is refused, also on the machine's
network address. Ray 2.60's GCS, raylet and agents listen on every interface whatever
the node IP (there is no bind setting), so the token is what keeps the network out; the
test records that, so a Ray that starts honouring the node IP shows up here."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

CONNECT = textwrap.dedent(
    """
    import sys, ray
    try:
        ray.init(address=sys.argv[1], log_to_driver=False)
    except Exception as err:
        print("REFUSED", type(err).__name__, err)
        sys.exit(3)
    print("CONNECTED", ray.cluster_resources())
    """
)


def _ray_listeners() -> set[str]:
    """Addresses Ray's processes (children of this one) listen on over TCP."""
    addresses = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        addresses |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
    return addresses


def _host_addresses() -> list[str]:
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET]  # fmt: skip


def test_local_ray_is_loopback_only_and_refuses_a_client_without_the_token(monkeypatch):
    from agentserve.serve import local

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # overridden, as in start_local
    local.pin_token_auth()
    ray.init(address="local", _node_ip_address=local.LOOPBACK, num_cpus=1,
             include_dashboard=False, log_to_driver=False)  # fmt: skip
    try:
        gcs = ray.get_runtime_context().gcs_address
        port = gcs.rsplit(":", 1)[1]
        listeners = _ray_listeners()
        wildcard = {"0.0.0.0", "::"} & listeners
        assert wildcard, f"Ray now binds only {listeners}: make the docs say loopback-only"
        outside = [a for a in _host_addresses() if not a.startswith("127.")]
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token",
               "RAY_gcs_rpc_server_connect_timeout_s": "5"}  # fmt: skip
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        for address in [gcs, *(f"{a}:{port}" for a in outside[:1])]:
            done = subprocess.run([sys.executable, "-c", CONNECT, address], env=env,
                                  capture_output=True, text=True, timeout=240)  # fmt: skip
            assert done.returncode == 3 and "REFUSED" in done.stdout, (address, done.stdout)
    finally:
        ray.shutdown()

"""Tool-schema fairness scenario (issue 30 item 1): a hostile tenant sends requests with
128 unique tool schemas at full tilt while a well-behaved tenant sends agent-style tool
requests (the same 8 tools each time); the well-behaved tenant's requests must all
succeed, with p99 latency within 1.5x of a run without the attack.

The hostile schemas are all distinct (no cache hit ever) and the last one is invalid, so
every hostile request costs the full meta-validation of 128 schemas and then gets 400:
the most validation work per request, none of it reaching the engine. The ingress runs
under uvicorn on a loopback port (real HTTP), the model is a FakeEngine; each tenant's
client runs in its own process (tests/reliability/schema_clients.py), as real clients do,
so the ingress's process holds only the ingress.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.scenario import Outcome, scenario
from tests.reliability.schema_bodies import GOOD_BODY, KEY_GOOD, KEY_HOSTILE, MODEL, hostile_body
from tests.reliability.tenants import serve_in_thread

__all__ = ["GOOD_BODY", "SchemaRun", "hostile_body", "run_schemas"]

CLIENT_START_S = 3.0  # the clients' imports and warm-up, before the clock starts

P99_RATIO_MAX = 1.5
ROOT = Path(__file__).resolve().parents[2]


def _spec() -> Any:
    tenants = [
        {"name": "hostile", "api_key_sha256": hash_api_key(KEY_HOSTILE), "sla": {}},
        {"name": "good", "api_key_sha256": hash_api_key(KEY_GOOD), "sla": {}},
    ]
    return DeploymentSpec.model_validate(
        {
            "models": [{"name": MODEL, "engine": "fake", "max_model_len": 4096, "max_num_seqs": 8}],
            "tenants": tenants,
        }
    )


@dataclass
class SchemaRun:
    """What one run saw."""

    good: dict[str, int] = field(default_factory=dict)
    hostile: dict[str, int] = field(default_factory=dict)
    latency_s: list[float] = field(default_factory=list)  # the good tenant's, 200s only

    def p(self, q: float) -> float | None:
        if not self.latency_s:
            return None
        ordered = sorted(self.latency_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _client(role: str, url: str, start_at: float, duration_s: float) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "tests.reliability.schema_clients", role, url]
    return subprocess.Popen(
        [*command, f"{start_at:.3f}", str(duration_s)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"a scenario client exited with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def run_schemas(attack: bool, duration_s: float = 8.0) -> SchemaRun:
    """One run, with or without the hostile tenant; each client in its own process
    (tests/reliability/schema_clients.py), the ingress alone in this one."""
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily

    engine = FakeEngine(
        MODEL, 4096, token_delay_s=0.002, max_num_seqs=8, accept_per_step=2, requests_kept=8
    )
    asyncio.run(engine.start())
    app = create_app(_spec(), {MODEL: LocalBackend(engine)})
    run = SchemaRun()
    with serve_in_thread(app) as base:
        url = f"{base}/v1/chat/completions"
        start_at = time.time() + CLIENT_START_S
        roles = ["good", "hostile"] if attack else ["good"]
        procs = {role: _client(role, url, start_at, duration_s) for role in roles}
        results = {role: _result(p, CLIENT_START_S + duration_s + 60) for role, p in procs.items()}
    run.good = results["good"]["statuses"]
    run.latency_s = results["good"]["latency_s"]
    run.hostile = results.get("hostile", {}).get("statuses", {})
    return run


def _summary(run: SchemaRun) -> dict[str, Any]:
    ms = {f"good_{k}_ms": run.p(q) for k, q in (("p50", 0.5), ("p99", 0.99))}
    return {
        "good_statuses": run.good,
        "hostile_statuses": run.hostile,
        **{k: None if v is None else round(1000 * v, 1) for k, v in ms.items()},
    }


@scenario("tenant_tool_schemas")
def tenant_tool_schemas(duration_s: float = 12.0) -> Outcome:
    """A hostile tenant sends unique 128-tool schemas from 8 clients at full tilt; the
    well-behaved tenant's tool requests (20/s) all succeed, p99 within 1.5x of a run
    without the attack."""
    quiet = run_schemas(False, duration_s)
    attacked = run_schemas(True, duration_s)
    good_sent = sum(attacked.good.values())
    good_ok = attacked.good.get("200", 0)
    hostile_due = sum(n for s, n in attacked.hostile.items() if s in ("400", "429"))
    errors_5xx = sum(
        n for by in (attacked.good, attacked.hostile) for s, n in by.items() if s.startswith("5")
    )
    base, under = quiet.p(0.99), attacked.p(0.99)
    ratio = None if not base or under is None else round(under / base, 2)
    return Outcome(
        requests=good_sent + sum(attacked.hostile.values()),
        lost=(good_sent - good_ok) + (sum(attacked.hostile.values()) - hostile_due),
        errors_5xx=errors_5xx,
        restarts=0,
        details={
            "no_attack": _summary(quiet),
            "attack": _summary(attacked),
            "good_p99_ratio": ratio,
            "good_p99_within_1_5x": ratio is not None and ratio <= P99_RATIO_MAX,
        },
    )

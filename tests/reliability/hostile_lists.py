"""Hostile lists and structured-output constraints (issue 64 items 1-2, 9): one tenant
sends requests whose lists an engine would walk at every step (stop_token_ids,
logit_bias, bad_words, stop) or whose grammar a replica would compile, as large as a
4 MiB body allows, while another tenant streams; the streaming tenant's TPOT stays within
1.2x of the rounds without the attack, and every hostile request gets its 400
(api/limits.py).

The ingress runs under uvicorn on a loopback port in this process, the model is a
FakeEngine; the streaming client is a thread here, the hostile one its own process (as
real clients are: its JSON encoding must not take this process's GIL), switched on and
off between rounds (interleave.py). Before the caps the hostile bodies were accepted:
1M token ids took 169-331 ms of protocol-model validation per request; with the caps but
decoding in the ingress's process (a worker thread: json.loads holds the GIL for the
whole document) the victim's TPOT was 3.1x; decoded in the schema child process
(api/body_check.py), see docs/reliability.md.

`run_interleaved` and `hostile_outcome` serve the other body-borne attacks too
(structured_outputs.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from typing import Any

from agentserve.api.schema_check import shared_schema_process
from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.interleave import (
    Switch,
    Victim,
    interleaved,
    spawn_attacker,
    tpot_details,
)
from tests.reliability.scenario import Outcome, scenario
from tests.reliability.tenants import serve_in_thread

__all__ = [
    "HOSTILE_BODIES",
    "attack",
    "hostile_lists",
    "hostile_outcome",
    "post_attack",
    "run_interleaved",
    "stream_tpot",
    "two_tenant_spec",
]

MODEL = "m"
KEY_HOSTILE, KEY_GOOD = "sk-lists-hostile", "sk-lists-good"
TPOT_RATIO_MAX = 1.2
_MSG = [{"role": "user", "content": "hello there"}]


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": _MSG, "max_tokens": 8, **fields}).encode()


HOSTILE_BODIES: dict[str, bytes] = {  # each under the 4 MiB body limit
    "stop_token_ids": _body(stop_token_ids=list(range(500_000))),
    "logit_bias": _body(logit_bias={str(i): 1 for i in range(200_000)}),
    "bad_words": _body(bad_words=["w"] * 500_000),
    "stop": _body(stop=["s" * (1 << 20)] * 3),
    "grammar": _body(structured_outputs={"grammar": "root ::= " + '"a" ' * 600_000}),
}
GOOD_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": " ".join(["word"] * 40)}],
    "max_tokens": 40,
    "stream": True,
}


def two_tenant_spec(**server: Any) -> DeploymentSpec:
    """Tenants "hostile" (KEY_HOSTILE) and "good" (KEY_GOOD) on one fake model; `server`:
    spec.server fields."""
    tenants = [
        {"name": "hostile", "api_key_sha256": hash_api_key(KEY_HOSTILE), "sla": {}},
        {"name": "good", "api_key_sha256": hash_api_key(KEY_GOOD), "sla": {}},
    ]
    model = {"name": MODEL, "engine": "fake", "max_model_len": 4096, "max_num_seqs": 8}
    spec = {"models": [model], "tenants": tenants}
    return DeploymentSpec.model_validate(spec | ({"server": server} if server else {}))


def stream_tpot(client: Any, url: str) -> tuple[int, float | None, bool]:
    """(status, TPOT s: mean gap between content chunks, ended with [DONE])."""
    headers = {"authorization": f"Bearer {KEY_GOOD}"}
    times: list[float] = []
    text = ""
    with client.stream("POST", url, json=GOOD_BODY, headers=headers) as r:
        for line in r.iter_lines():
            text = line or text
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                times.append(time.perf_counter())
        status = r.status_code
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return status, tpot, text.strip() == "data: [DONE]"


def post_attack(url: str, folder: str, key: str, bodies: dict[str, bytes]) -> dict:
    """A hostile client (its own process): `bodies` in a loop while the Switch in `folder`
    is on; name -> status -> count."""
    import httpx

    switch = Switch(folder)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    seen: dict[str, dict[str, int]] = {}
    with httpx.Client(timeout=60, trust_env=False) as client:
        while switch.wait_go():
            while switch.active():
                for name, raw in bodies.items():
                    r = client.post(url, content=raw, headers=headers)
                    by = seen.setdefault(name, {})
                    by[str(r.status_code)] = by.get(str(r.status_code), 0) + 1
    return seen


def attack(url: str, folder: str) -> dict[str, dict[str, int]]:
    """This scenario's hostile client: HOSTILE_BODIES."""
    return post_attack(url, folder, KEY_HOSTILE, HOSTILE_BODIES)


def run_interleaved(
    spec: DeploymentSpec,
    attacker_module: str,
    rounds: int,
    per_round: int,
    settle_s: float = 0.5,
    keepalive: bool = True,
    backend: Any = None,
    **uvicorn: Any,
) -> tuple[Victim, Victim, dict[str, Any]]:
    """The ingress of `spec` on a FakeEngine under uvicorn (`uvicorn`: Config options);
    the good tenant streams `rounds` x `per_round` times quiet and as often while
    `attacker_module`'s process attacks (interleave.py; `settle_s` after it starts), on
    one kept-alive connection or (`keepalive` False) a new one per stream; (quiet,
    attacked, what the attacker reports). `backend`: the model's ModelBackend instead
    of one FakeEngine (its `start()` is awaited)."""
    import httpx
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily

    if backend is None:
        engine = FakeEngine(MODEL, 4096, token_delay_s=0.01, max_num_seqs=8, accept_per_step=1)
        backend = LocalBackend(engine)
    asyncio.run((backend.engine if isinstance(backend, LocalBackend) else backend).start())
    app = create_app(spec, {MODEL: backend})
    shared_schema_process().ready()  # large bodies are decoded in its child: up first
    with serve_in_thread(app, **uvicorn) as base, tempfile.TemporaryDirectory() as tmp:
        url, switch = f"{base}/v1/chat/completions", Switch(tmp)
        attacker = spawn_attacker(attacker_module, url, tmp)
        try:
            limits = httpx.Limits(max_keepalive_connections=None if keepalive else 0)
            with httpx.Client(timeout=60, trust_env=False, limits=limits) as client:
                stream_tpot(client, url)  # warm-up (lazy imports, first connection)
                switch.off()  # the attacker's process is up
                quiet, attacked = interleaved(
                    lambda: stream_tpot(client, url), switch, rounds, per_round, settle_s
                )
        finally:
            switch.finish()
            out, _ = attacker.communicate(timeout=120)
    return quiet, attacked, json.loads(out.strip().splitlines()[-1])


def hostile_outcome(
    quiet: Victim, attacked: Victim, hostile: dict, expected: dict[str, str] | None = None
) -> Outcome:
    """Lost: a good stream without its complete 200, a hostile request without the status
    `expected` names for its body (400 by default)."""
    want = expected or {}
    hostile_sent = sum(n for by in hostile.values() for n in by.values())
    hostile_due = sum(by.get(want.get(name, "400"), 0) for name, by in hostile.items())
    hostile_5xx = sum(
        n for by in hostile.values() for status, n in by.items() if status.startswith("5")
    )
    return Outcome(
        requests=quiet.sent + attacked.sent + hostile_sent,
        lost=quiet.lost + attacked.lost + (hostile_sent - hostile_due),
        errors_5xx=quiet.errors_5xx + attacked.errors_5xx + hostile_5xx,
        restarts=0,
        details=tpot_details(quiet, attacked, TPOT_RATIO_MAX) | {"hostile_statuses": hostile},
    )


@scenario("input_hostile_lists")
def hostile_lists(rounds: int = 5, per_round: int = 4) -> Outcome:
    """A tenant sends 500k token ids, 200k logit_bias entries, 500k bad words, 1 MiB stop
    strings and a 3.6 MB grammar in a loop while another streams (attack on and off
    between rounds): every hostile request gets 400, the streams all complete, their
    median TPOT within 1.2x of the rounds without the attack."""
    quiet, attacked, hostile = run_interleaved(
        two_tenant_spec(), "tests.reliability.hostile_lists", rounds, per_round
    )
    return hostile_outcome(quiet, attacked, hostile)


if __name__ == "__main__":  # the hostile client: URL SWITCH_FOLDER
    print(json.dumps(attack(sys.argv[1], sys.argv[2])))

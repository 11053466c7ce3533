"""Hostile lists and structured-output constraints (issue 64 items 1-2): one tenant sends
requests whose lists an engine would walk at every step (stop_token_ids, logit_bias,
bad_words, stop) or whose grammar a replica would compile, as large as a 4 MiB body
allows, while another tenant streams; the streaming tenant's TPOT stays within 1.2x of a
run without the attack, and every hostile request gets its 400 (api/limits.py).

The ingress runs under uvicorn on a loopback port in this process, the model is a
FakeEngine; the streaming client is a thread here, the hostile one its own process (as
real clients are: its JSON encoding must not take this process's GIL). Before the caps
the hostile bodies were accepted: 1M token ids took 169-331 ms of protocol-model
validation per request, holding the GIL the streaming tenant's loop needs.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.scenario import Outcome, scenario
from tests.reliability.tenants import serve_in_thread

__all__ = ["HOSTILE_BODIES", "attack", "hostile_lists"]

MODEL = "m"
KEY_HOSTILE, KEY_GOOD = "sk-lists-hostile", "sk-lists-good"
TPOT_RATIO_MAX = 1.2
ATTACKER_START_S = 4.0  # the attacker process's imports, before the measured streams
ROOT = Path(__file__).resolve().parents[2]
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


def _spec() -> DeploymentSpec:
    tenants = [
        {"name": "hostile", "api_key_sha256": hash_api_key(KEY_HOSTILE), "sla": {}},
        {"name": "good", "api_key_sha256": hash_api_key(KEY_GOOD), "sla": {}},
    ]
    model = {"name": MODEL, "engine": "fake", "max_model_len": 4096, "max_num_seqs": 8}
    return DeploymentSpec.model_validate({"models": [model], "tenants": tenants})


def _stream_tpot(client: Any, url: str) -> tuple[int, float | None, bool]:
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


def attack(url: str, stop_file: str) -> dict[str, dict[str, int]]:
    """The hostile client (its own process): HOSTILE_BODIES in a loop until `stop_file`
    exists; name -> status -> count."""
    import httpx

    headers = {"authorization": f"Bearer {KEY_HOSTILE}", "content-type": "application/json"}
    seen: dict[str, dict[str, int]] = {}
    with httpx.Client(timeout=60, trust_env=False) as client:
        while not os.path.exists(stop_file):
            for name, raw in HOSTILE_BODIES.items():
                r = client.post(url, content=raw, headers=headers)
                by = seen.setdefault(name, {})
                by[str(r.status_code)] = by.get(str(r.status_code), 0) + 1
    return seen


def _attacker(url: str, stop_file: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "tests.reliability.hostile_lists", url, stop_file]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def _run(attack: bool, streams: int) -> dict[str, Any]:
    """One run: `streams` sequential streams of the good tenant, with or without the
    hostile tenant sending HOSTILE_BODIES in a loop meanwhile."""
    import httpx
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily

    engine = FakeEngine(MODEL, 4096, token_delay_s=0.01, max_num_seqs=8, accept_per_step=1)
    asyncio.run(engine.start())
    app = create_app(_spec(), {MODEL: LocalBackend(engine)})
    hostile: dict[str, dict[str, int]] = {}
    good: dict[str, int] = {}
    tpots: list[float] = []
    truncated = 0
    with serve_in_thread(app) as base, tempfile.TemporaryDirectory() as tmp:
        url, stop_file = f"{base}/v1/chat/completions", os.path.join(tmp, "stop")
        with httpx.Client(timeout=60, trust_env=False) as client:
            _stream_tpot(client, url)  # warm-up (lazy imports, first connection)
            attacker = _attacker(url, stop_file) if attack else None
            if attacker is not None:
                time.sleep(ATTACKER_START_S)
            for _ in range(streams):
                status, tpot, done = _stream_tpot(client, url)
                good[str(status)] = good.get(str(status), 0) + 1
                truncated += status == 200 and not done
                if tpot is not None:
                    tpots.append(tpot)
        if attacker is not None:
            open(stop_file, "w").close()
            out, _ = attacker.communicate(timeout=120)
            hostile = json.loads(out.strip().splitlines()[-1])
    return {"good": good, "hostile": hostile, "tpot_s": tpots, "truncated": truncated}


def _median_ms(values: list[float]) -> float | None:
    return round(1000 * statistics.median(values), 2) if values else None


@scenario("input_hostile_lists")
def hostile_lists(streams: int = 20) -> Outcome:
    """A tenant sends 500k token ids, 200k logit_bias entries, 500k bad words, 1 MiB stop
    strings and a 2.4 MiB grammar in a loop while another streams: every hostile request
    gets 400, the streams all complete, their median TPOT within 1.2x of the quiet run."""
    quiet = _run(False, streams)
    attacked = _run(True, streams)
    hostile_sent = sum(n for by in attacked["hostile"].values() for n in by.values())
    hostile_400 = sum(by.get("400", 0) for by in attacked["hostile"].values())
    good_sent = sum(attacked["good"].values())
    good_ok = attacked["good"].get("200", 0) - attacked["truncated"]
    errors_5xx = sum(
        n
        for by in [attacked["good"], *attacked["hostile"].values()]
        for status, n in by.items()
        if status.startswith("5")
    )
    base, under = _median_ms(quiet["tpot_s"]), _median_ms(attacked["tpot_s"])
    ratio = round(under / base, 2) if base and under else None
    return Outcome(
        requests=good_sent + hostile_sent,
        lost=(good_sent - good_ok) + (hostile_sent - hostile_400),
        errors_5xx=errors_5xx,
        restarts=0,
        details={
            "no_attack_tpot_median_ms": base,
            "attack_tpot_median_ms": under,
            "tpot_ratio": ratio,
            "tpot_within_1_2x": ratio is not None and ratio <= TPOT_RATIO_MAX,
            "good_statuses": attacked["good"],
            "hostile_statuses": attacked["hostile"],
        },
    )


if __name__ == "__main__":  # the hostile client: URL STOP_FILE
    print(json.dumps(attack(sys.argv[1], sys.argv[2])))

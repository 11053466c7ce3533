"""Fault scenarios with real vLLM replicas: two CPU replicas of the bundled model (one
core each, float32, greedy, eager mode), 24 concurrent streams, and three faults on one
deployment, so the minutes of engine starts are paid once:
- drain: a redeploy while real generations stream (the first deployment has migration
  off, so only Serve's graceful stop can save them);
- kill: a replica actor killed (ray.kill) mid-stream; the ingress continues its streams
  on the other replica from their token ids;
- hung: a replica's engine-core process stopped (SIGSTOP): vLLM's own health check sees
  nothing, the replica's step-progress check (engine/progress.py) fails it, the replica
  exits and its streams continue elsewhere.
Every stream must equal the same request's uninterrupted output (a reference pass on the
same replicas before any fault, float32 so greedy tokens do not depend on the batch), so
a cut, duplicated or wrongly continued token counts as lost.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

from agentserve_bench.engines import OneCoreVLLM

from tests.reliability import serve_harness as h
from tests.reliability.scenario import Outcome, scenario

__all__ = ["OneCoreVLLM", "vllm_faults"]

PORT = 8772
READY_S = 600.0  # two eager vLLM engines starting on two cores (~30 s each alone)
STREAMS = 24
TOKENS = 48
FAULT_AT_ONGOING = 5  # streams the faulted replica serves at least
HEALTH = {"health_check_period_s": 2.0, "health_check_timeout_s": 10.0}
DRAIN = {"graceful_shutdown_timeout_s": 300.0, "graceful_shutdown_wait_loop_s": 0.5}
TASKS = (
    "reverses a linked list", "parses an ISO 8601 date", "merges two sorted lists",
    "counts words in a file", "checks if a string is a palindrome", "flattens a nested list",
    "computes a moving average", "validates an email address", "finds the median of a list",
    "converts Celsius to Fahrenheit", "removes duplicates keeping order", "reads a CSV file",
    "retries a function with backoff", "computes Fibonacci numbers", "chunks a list into pages",
    "finds prime numbers below n", "deep-merges two dictionaries", "transposes a matrix",
    "parses query strings", "formats bytes as KB/MB/GB", "rotates a list by k",
    "groups items by a key", "computes the edit distance", "checks balanced brackets",
)  # fmt: skip


def vllm_spec(migrations: int, replicas: dict[str, Any]) -> Any:
    model = {
        "engine": "vllm",
        "dtype": "float32",
        "max_model_len": 512,
        "max_num_seqs": 16,
        "drafter": {"enabled": False},
        "engine_args": {"enforce_eager": True},  # no torch.compile warm-up: ~30 s starts
    }
    return h.spec_for(
        2, model=model, server={"max_migrations": migrations}, replicas={**HEALTH, **replicas}
    )


def _body(i: int) -> dict:
    task = TASKS[i % len(TASKS)]
    body = h.chat_body(i)
    body["messages"][0]["content"] = f"Write a short Python function that {task}."
    body |= {"max_tokens": TOKENS, "temperature": 0.0, "ignore_eos": True}
    return body


def _check(results: list[h.Result], want: list[tuple[str, dict]]) -> dict[str, Any]:
    lost = [i for i, (r, w) in enumerate(zip(results, want, strict=True)) if not r.complete(w)]
    return {
        "requests": len(results),
        "lost": len(lost),
        "errors_5xx": sum(
            r.status >= 500 or (r.status == 200 and r.error is not None) for r in results
        ),
        "lost_examples": [_example(i, results[i], want[i][0]) for i in lost[:3]],
        "longest_stream_s": round(max(r.seconds for r in results), 1),
    }


def _example(i: int, result: h.Result, want: str) -> dict[str, Any]:
    tail = {"got": result.text[-80:], "want": want[-80:]}
    return {"i": i, "status": result.status, "error": result.error} | tail


def _fault_run(base: str, bodies: list[dict], fault: Any) -> tuple[list[h.Result], dict]:
    """Stream every body at once; when a replica serves >= FAULT_AT_ONGOING streams that
    have run 2 s, apply `fault(replica_name)` to it (in a thread: polling must not stall
    the client's event loop)."""
    names = sorted(h.replica_names())
    at: dict[str, Any] = {}
    done = threading.Event()

    def watcher() -> None:
        time.sleep(2.0)
        while not done.is_set():
            victim = h.busiest_replica(names, FAULT_AT_ONGOING, at)
            if victim is not None:
                at["ongoing_at_fault"] = at.pop("ongoing")
                at["fault_at_s"] = round(time.perf_counter() - start, 1)
                fault(victim)
                return
            time.sleep(0.2)

    start = time.perf_counter()
    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    results = asyncio.run(h.send_all(base, bodies, len(bodies)))
    done.set()
    thread.join(timeout=30)
    return results, at


def _stop_engine_core(name: str) -> None:
    """SIGSTOP every child process of the replica actor (vLLM's engine core)."""
    import psutil

    for child in psutil.Process(h.replica_pid(name)).children(recursive=True):
        child.send_signal(signal.SIGSTOP)


def _wait_replaced(before: set[str]) -> dict[str, Any]:
    waited = h.wait_for(
        lambda: h.running_replicas() == 2 and len(h.replica_names() - before) > 0, READY_S
    )
    return {
        "restarts": len(h.replica_names() - before),
        "replicas_back_after_s": None if waited is None else round(waited, 1),
    }


def _drain_run(base: str, bodies: list[dict], want: list, next_app: Any) -> dict[str, Any]:
    """Redeploy to `next_app` while every body streams on the current replicas."""

    async def run() -> list[h.Result]:
        load = asyncio.create_task(h.send_all(base, bodies, len(bodies)))
        await asyncio.sleep(3.0)  # every stream admitted and generating
        await asyncio.to_thread(h.deploy, next_app, wait=False)
        return await load

    results = asyncio.run(run())
    ready = h.wait_for(lambda: h.running_replicas() == 2 and len(h.replica_names()) == 2, READY_S)
    return _check(results, want) | {"new_replicas_ready_after_s": ready and round(ready, 1)}


@scenario("faults_vllm")
def vllm_faults(faults: tuple[str, ...] = ("drain", "kill", "hung"), port: int = PORT) -> Outcome:
    """Real vLLM: two one-core CPU replicas of the bundled model (float32, greedy), 24
    streams of 48 tokens; a redeploy (drain), a replica killed and an engine core stopped
    (SIGSTOP) mid-stream: every stream equals its uninterrupted output."""
    details: dict[str, Any] = {"streams": STREAMS, "tokens": TOKENS, "health_check": HEALTH}
    bodies = [_body(i) for i in range(STREAMS)]
    factory = OneCoreVLLM()
    total = {"requests": 0, "lost": 0, "errors_5xx": 0, "restarts": 0}
    with h.local_serve(port) as base:
        first = vllm_spec(0 if "drain" in faults else 2, DRAIN)
        with h.deployed(first, factory, ready_s=READY_S):
            reference = asyncio.run(h.send_all(base, bodies, len(bodies)))
            bad = [r for r in reference if not (r.status == 200 and r.done and r.error is None)]
            if bad:
                raise RuntimeError(f"the reference pass failed: {bad[0]}")
            want = [(r.text, r.usage) for r in reference]
            details["reference_s"] = round(max(r.seconds for r in reference), 1)
            if "drain" in faults:
                next_app = h.app_for(vllm_spec(2, DRAIN), factory)
                details["drain"] = _drain_run(base, bodies, want, next_app)
            for fault, act in (("kill", h.kill_replica), ("hung", _stop_engine_core)):
                if fault not in faults:
                    continue
                before = h.replica_names()
                earlier = h.metric(base, "agentserve_migrations_total")
                results, at = _fault_run(base, bodies, act)
                migrations = h.metric(base, "agentserve_migrations_total") - earlier
                details[fault] = _check(results, want) | at | {"migrations": migrations}
                if fault != faults[-1]:
                    details[fault] |= _wait_replaced(before)
                else:  # the last fault: a replacement started is enough (no engine wait)
                    h.wait_for(lambda b=before: len(h.replica_names() - b) > 0, 120)
                    details[fault]["restarts"] = len(h.replica_names() - before)
    for run in (details[f] for f in faults):
        for key in total:
            total[key] += run.get(key, 0)
    return Outcome(engine="vllm", details=details, **total)

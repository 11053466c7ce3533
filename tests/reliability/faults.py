"""Fault scenarios on a real local Ray Serve with the fake engine: a replica killed or its
engine crashing mid-stream (migration), a stuck engine (health checks), scale-down and
shutdown (drain), a flood (bounded queues, 503 + Retry-After) and a soak run (memory).

Every request is checked against the undisturbed fake engine's answer (serve_harness), so
`lost` counts each request that did not get its complete, exact output. Scenarios that
prove a mechanism also run a control without it (details["control_..."]): the check can
fail. `errors_5xx` counts 5xx answers (and in-band stream errors) except well-formed
backpressure 503s (Retry-After + OpenAI error body), which the flood counts in details.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from agentserve_bench.fake_engine import FakeEngineFactory

from tests.reliability import serve_harness as h
from tests.reliability.scenario import Outcome, scenario

__all__ = [
    "backpressure_flood",
    "drain_scale_down",
    "engine_crash_mid_stream",
    "replica_killed_mid_stream",
    "soak_memory",
    "stuck_engine_replaced",
]

PORT = 8771
RESTART_TIMEOUT_S = 90.0
KILL_AT_ONGOING = 5  # streams the killed replica is serving at least
# A drain waits for streams of 4 s (80 tokens, 50 ms each) that stretch to 15-25 s while the
# redeploy starts new replica processes on a 2-core machine; a timeout near that cut them
# all in a loaded CI run, so it leaves ample room (the streams end long before it).
DRAIN_TIMEOUT_S = 120.0
RSS_GROWTH_LIMIT_MB = 24.0  # per process over the soak, after warm-up ("flat")


def _factory(token_delay_s: float = 0.0, fault_prompts: bool = False) -> Any:

    return FakeEngineFactory(
        token_delay_s=token_delay_s, accept_per_step=1, fault_prompts=fault_prompts
    )


def _lost(results: list[h.Result], bodies: list[dict]) -> int:
    return sum(not r.complete(h.expected(b)) for r, b in zip(results, bodies, strict=True))


def _backpressure(r: h.Result) -> bool:
    """A well-formed refusal: 503, Retry-After >= 1, OpenAI error body."""
    error = (r.error or {}).get("error") or {}
    return (
        r.status == 503
        and r.retry_after is not None
        and int(r.retry_after) >= 1
        and {"message", "type", "code"} <= set(error)
    )


def _5xx(results: list[h.Result]) -> int:
    in_band = [r for r in results if r.status == 200 and r.error is not None]
    return sum(r.status >= 500 and not _backpressure(r) for r in results) + len(in_band)


def _restarted(before: set[str], replicas: int) -> tuple[int, float | None]:
    """(replicas started anew since `before`, seconds until `replicas` RUNNING again)."""
    waited = h.wait_for(
        lambda: h.running_replicas() == replicas and len(h.replica_names() - before) > 0,
        RESTART_TIMEOUT_S,
    )
    return len(h.replica_names() - before), None if waited is None else round(waited, 1)


def _with_fault(fault: str, i: int) -> dict:
    body = h.chat_body(i, words=20)
    body["messages"][0]["content"] = f"FAULT {fault} " + body["messages"][0]["content"]
    return body


def _kill_run(base: str, requests: int, kill_after: int) -> tuple[list, list, dict]:
    """After 20 warm-up requests, stream `requests` distinct chat requests, 20 at a time;
    once `kill_after` have finished and a replica serves at least KILL_AT_ONGOING streams,
    ray.kill that replica's actor while the rest stream."""
    bodies = [h.chat_body(i, words=23) for i in range(requests)]
    warm_up = [h.chat_body(-i, words=3) for i in range(1, 21)]  # not counted
    asyncio.run(h.send_all(base, warm_up, 20))  # the first wave waits ~5 s for a cold path
    names = sorted(h.replica_names())
    finished = [0]
    at: dict[str, Any] = {}

    def killer() -> None:  # a thread: polling must not stall the client's event loop
        while finished[0] < kill_after:
            time.sleep(0.02)
        while finished[0] < requests:
            victim = h.busiest_replica(names, KILL_AT_ONGOING, at)
            if victim is not None:
                h.kill_replica(victim)
                at["finished_at_kill"] = finished[0]
                at["ongoing_at_kill"] = at.pop("ongoing")
                return

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    results = asyncio.run(
        h.send_all(base, bodies, 20, on_done=lambda n: finished.__setitem__(0, n))
    )
    thread.join(timeout=10)
    return results, bodies, at


@scenario("faults_replica_killed")
def replica_killed_mid_stream(requests: int = 100, port: int = PORT) -> Outcome:
    """Two replicas, 100 streaming requests (24 tokens, 80 ms each, 20 at a time); after
    33 finished, a replica actor serving >= 5 streams is killed (ray.kill): every
    stream completes with the undisturbed output; control: the same with migration off
    loses the killed streams."""
    details: dict[str, Any] = {}
    runs = {}
    with h.local_serve(port) as base:
        for label, migrations in (("migrating", 2), ("control_without_migration", 0)):
            spec = h.spec_for(2, server={"max_migrations": migrations})
            # Streams of ~2 s outlast a slow poll on a loaded machine: with 0.7 s streams
            # the replica polled at >= 5 streams had finished them all by the kill (CI).
            with h.deployed(spec, _factory(token_delay_s=0.08)):
                before = h.replica_names()
                start = time.perf_counter()
                results, bodies, at = _kill_run(base, requests, requests // 3)
                wall_s = round(time.perf_counter() - start, 1)
                restarts, back_s = _restarted(before, 2)
                runs[label] = (results, bodies, restarts)
                details[label] = {
                    **at,
                    "lost": _lost(results, bodies),
                    "errors_5xx": _5xx(results),
                    "migrations": h.metric(base, "agentserve_migrations_total"),
                    "restarts": restarts,
                    "replicas_back_after_s": back_s,
                    "wall_s": wall_s,
                }
    results, bodies, restarts = runs["migrating"]
    return Outcome(len(results), _lost(results, bodies), _5xx(results), restarts, details)


@scenario("faults_engine_crash")
def engine_crash_mid_stream(requests: int = 40, port: int = PORT) -> Outcome:
    """Two replicas; one engine crashes mid-run (fake "FAULT crash": every stream on it
    raises EngineDeadError, the replica exits, Serve starts a new one): every stream
    completes with the undisturbed output."""
    with h.local_serve(port) as base:
        factory = _factory(token_delay_s=0.03, fault_prompts=True)
        with h.deployed(h.spec_for(2), factory):
            before = h.replica_names()
            bodies = [h.chat_body(i, words=23) for i in range(requests)]
            bodies.insert(requests // 4, _with_fault("crash", 10_000))
            results = asyncio.run(h.send_all(base, bodies, 16))
            restarts, back_s = _restarted(before, 2)
            migrations = h.metric(base, "agentserve_migrations_total")
    return Outcome(
        requests=len(results),
        lost=_lost(results, bodies),
        errors_5xx=_5xx(results),
        restarts=restarts,
        details={"migrations": migrations, "replicas_back_after_s": back_s},
    )


@scenario("faults_stuck_engine")
def stuck_engine_replaced(requests: int = 30, port: int = PORT) -> Outcome:
    """Two replicas, health checks every 1 s (timeout 3 s); one engine gets stuck (fake
    "FAULT stuck": steps and health never return). Three failed probes and the replica
    exits, Serve replaces it; the streams it held continue on the other: none lost."""
    health = {"health_check_period_s": 1.0, "health_check_timeout_s": 3.0}
    with h.local_serve(port) as base:
        factory = _factory(token_delay_s=0.03, fault_prompts=True)
        with h.deployed(h.spec_for(2, replicas=health), factory):
            before = h.replica_names()
            bodies = [_with_fault("stuck", 20_000)]
            bodies += [h.chat_body(i, words=23) for i in range(requests)]
            start = time.perf_counter()
            results = asyncio.run(h.send_all(base, bodies, 16))
            run_s = round(time.perf_counter() - start, 1)
            restarts, back_s = _restarted(before, 2)
            migrations = h.metric(base, "agentserve_migrations_total")
    return Outcome(
        requests=len(results),
        lost=_lost(results, bodies),
        errors_5xx=_5xx(results),
        restarts=restarts,
        details={
            "health_check": health,
            "migrations": migrations,
            "slowest_request_s": round(max(r.seconds for r in results), 1),
            "run_s": run_s,
            "replicas_back_after_s": back_s,
        },
    )


def _redeploy_run(base: str, graceful_s: float, streams: int) -> dict[str, Any]:
    """2 replicas -> 1 by redeploying while `streams` long streams (80 tokens, 50 ms
    each) run. serve.run gives every deployment a new code version, so Serve stops all old
    replicas (ingress included) through its graceful stop, the path scale-down and
    shutdown take too; migration is off, so only draining can save the streams."""
    spec = h.spec_for(
        2,
        server={"max_migrations": 0},
        replicas={"graceful_shutdown_timeout_s": graceful_s, "graceful_shutdown_wait_loop_s": 0.5},
    )
    factory = _factory(token_delay_s=0.05)
    bodies = [h.chat_body(i, words=79) for i in range(streams)]
    with h.deployed(spec, factory):

        async def run() -> list[h.Result]:
            load = asyncio.create_task(h.send_all(base, bodies, streams))
            at["streaming_at_redeploy"] = await asyncio.to_thread(_under_way, base, streams)
            await asyncio.to_thread(h.deploy, h.app_for(spec, factory, 1), wait=False)
            return await load

        at: dict[str, Any] = {}
        results = asyncio.run(run())
        one_s = h.wait_for(lambda: len(h.replica_names()) == 1, 60)
    return {
        "requests": len(results),
        "lost": _lost(results, bodies),
        "errors_5xx": _5xx(results),
        "graceful_shutdown_timeout_s": graceful_s,
        **at,
        "longest_stream_s": round(max(r.seconds for r in results), 1),
        "one_replica_after_s": None if one_s is None else round(one_s, 1),
    }


def _shutdown_run(base: str, streams: int) -> dict[str, Any]:
    """Delete the whole application while `streams` streams are in flight."""
    from ray import serve

    spec = h.spec_for(2, server={"max_migrations": 0})
    bodies = [h.chat_body(i, words=39) for i in range(streams)]
    h.deploy(h.app_for(spec, _factory(token_delay_s=0.05)))

    async def run() -> list[h.Result]:
        load = asyncio.create_task(h.send_all(base, bodies, streams))
        at["streaming_at_delete"] = await asyncio.to_thread(_under_way, base, streams)
        await asyncio.to_thread(serve.delete, h.APP)
        return await load

    at: dict[str, Any] = {}
    results = asyncio.run(run())
    return {
        "requests": len(results),
        "lost": _lost(results, bodies),
        "errors_5xx": _5xx(results),
        **at,
    }


def _under_way(base: str, streams: int, timeout_s: float = 30.0) -> int:
    """Block until the ingress has `streams` requests in flight, each past its first token
    (every stream is under way, however slow the machine), or timeout_s; returns the
    streaming count seen last."""
    seen = 0

    def enough() -> bool:
        nonlocal seen
        in_flight = h.metric(base, "agentserve_requests_in_flight")
        seen = int(in_flight - h.metric(base, "agentserve_requests_queued"))
        return seen >= streams

    h.wait_for(enough, timeout_s, step_s=0.1)
    return seen


@scenario("faults_drain")
def drain_scale_down(streams: int = 16, port: int = PORT) -> Outcome:
    """Replicas stopped with 16 long streams in flight (migration off): a redeploy from 2
    replicas to 1 (Serve's graceful stop of every old replica, graceful_shutdown_timeout_s
    DRAIN_TIMEOUT_S), then deleting the application with 8 streams in flight: all complete. Control:
    the same redeploy without drain (graceful_shutdown_timeout_s 0) cuts the streams."""
    with h.local_serve(port) as base:
        drained = _redeploy_run(base, DRAIN_TIMEOUT_S, streams)
        shutdown = _shutdown_run(base, streams // 2)
        control = _redeploy_run(base, 0.0, streams)
    return Outcome(
        requests=drained["requests"] + shutdown["requests"],
        lost=drained["lost"] + shutdown["lost"],
        errors_5xx=drained["errors_5xx"] + shutdown["errors_5xx"],
        restarts=0,
        details={"redeploy_2_to_1": drained, "shutdown": shutdown, "control_no_drain": control},
    )


@scenario("faults_backpressure")
def backpressure_flood(requests: int = 60, port: int = PORT) -> Outcome:
    """One replica (max_num_seqs 2), max_queue_len 4: 60 streaming requests at once.
    Beyond the 6 the deployment can hold, 503 + Retry-After + OpenAI error body, no 500;
    clients that wait Retry-After and retry all get the complete answer."""
    spec = h.spec_for(1, model={"max_num_seqs": 2}, server={"max_queue_len": 4})
    bodies = [h.chat_body(i, words=11) for i in range(requests)]
    with h.local_serve(port) as base, h.deployed(spec, _factory(token_delay_s=0.03)):
        first = asyncio.run(h.send_all(base, bodies, requests))
        retried = asyncio.run(h.send_all(base, bodies, requests, retry_503=30))
    refused = [r for r in first if r.status == 503]
    return Outcome(
        requests=len(retried),
        lost=_lost(retried, bodies),
        errors_5xx=_5xx(first) + _5xx(retried),
        restarts=0,
        details={
            "first_wave": {
                "ok": sum(r.status == 200 for r in first),
                "backpressure_503": len(refused),
                "with_retry_after_and_error_body": sum(map(_backpressure, refused)),
                "malformed_503": [
                    {"retry_after": r.retry_after, "error": r.error}
                    for r in refused
                    if not _backpressure(r)
                ][:5],
                "other": sum(r.status not in (200, 503) for r in first),
            },
            "retrying_clients": {
                "ok": sum(r.status == 200 for r in retried),
                "max_attempts": max(r.attempts for r in retried),
                "backpressure_503_seen": sum(r.attempts - 1 for r in retried),
            },
        },
    )


@scenario("faults_soak_memory")
def soak_memory(requests: int = 3000, port: int = PORT) -> Outcome:
    """3,000 short requests (one in four streaming) at 16 at a time against one replica:
    all complete; resident memory of the ingress and replica processes, sampled after a
    warm-up and after each third, grows less than RSS_GROWTH_LIMIT_MB ("rss_flat")."""
    titles = (f"ServeReplica:{h.APP}:ingress", f"ServeReplica:{h.APP}:{h.deployment()}")
    bodies = [h.chat_body(i, words=5, stream=i % 4 == 0) for i in range(requests)]
    warm = bodies[: requests // 10]
    with h.local_serve(port) as base, h.deployed(h.spec_for(1), _factory()):
        asyncio.run(h.send_all(base, warm, 16))
        samples = [h.rss_mb(*titles)]
        results: list[h.Result] = []
        for part in range(3):
            chunk = bodies[part * requests // 3 : (part + 1) * requests // 3]
            results += asyncio.run(h.send_all(base, chunk, 16))
            samples.append(h.rss_mb(*titles))
    growth = {t: round(samples[-1][t] - samples[0][t], 1) for t in titles}
    flat = all(samples[0][t] > 0 and growth[t] < RSS_GROWTH_LIMIT_MB for t in titles)
    return Outcome(
        requests=len(results) + len(warm),
        lost=_lost(results, bodies),
        errors_5xx=_5xx(results),
        restarts=0,
        details={
            "rss_mb": samples,
            "rss_growth_mb": growth,
            "rss_flat": flat,
            "rss_growth_limit_mb": RSS_GROWTH_LIMIT_MB,
            "warm_up_requests": len(warm),
        },
    )

"""Two ingress replicas on a local Ray Serve (fake engine): a tenant's limit holds across
both (one tenant-limits keeper), and killing one ingress replica mid-run loses no request
that a retrying client sends again; the limit still holds after the kill."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from agentserve.serve.names import INGRESS_NAME, QUOTA_NAME
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngineFactory

from tests.reliability import serve_harness as h

PORT = 8774
LIMITED, FREE = "sk-limited-tenant-0123456789", "sk-free-tenant-0123456789"
CAP = 3  # the limited tenant's max_concurrent_requests
# 41 tokens: ~4 s a stream, so the 8 of a limit check are all admitted or refused while the
# first 3 still run, on a busy machine too
ENGINE = FakeEngineFactory(token_delay_s=0.1, accept_per_step=1)


def _spec() -> DeploymentSpec:
    base = h.spec_for(1, server={"port": PORT, "ingress_replicas": 2})
    raw = base.model_dump(mode="json", exclude_unset=True)
    raw["tenants"] = [
        {
            "name": "limited",
            "api_key_sha256": hash_api_key(LIMITED),
            "sla": {},
            "rate_limit": {"max_concurrent_requests": CAP},
        },
        {"name": "free", "api_key_sha256": hash_api_key(FREE), "sla": {}},
    ]
    return DeploymentSpec.model_validate(raw)


@pytest.fixture(scope="module")
def base():
    pytest.importorskip("ray")
    from agentserve.serve.app import build_app

    with h.local_serve(PORT) as url:
        h.deploy(build_app(_spec(), ENGINE))
        yield url


async def _send(base: str, key: str, bodies: list[dict], retries: int = 0) -> list[h.Result]:
    """Stream every body at once; a request that did not complete is sent again (up to
    `retries` times), as a client that retries does."""
    url = f"{base}/v1/chat/completions"
    headers = {"authorization": f"Bearer {key}"}
    wants = [await asyncio.to_thread(h.expected, b) for b in bodies]  # it runs a loop
    async with httpx.AsyncClient(timeout=60, headers=headers, trust_env=False) as client:

        async def one(body: dict, want: tuple) -> h.Result:
            result = await h.stream_one(client, url, body)
            for attempt in range(retries):
                if result.complete(want):
                    break
                await asyncio.sleep(0.5)
                result = await h.stream_one(client, url, body)
                result.attempts = attempt + 2
            return result

        return await asyncio.gather(*(one(b, w) for b, w in zip(bodies, wants, strict=True)))


def _keeper_state() -> dict:
    from ray import serve

    return serve.get_deployment_handle(QUOTA_NAME, h.APP).state.remote().result()


def _ingress_replicas() -> list[str]:
    import ray

    prefix = f"SERVE_REPLICA::{h.APP}#{INGRESS_NAME}#"
    actors = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in actors if a["name"].startswith(prefix))


def _check_limit_holds(base: str) -> None:
    bodies = [h.chat_body(i, words=40) for i in range(8)]
    results = asyncio.run(_send(base, LIMITED, bodies))
    statuses = sorted(r.status for r in results)
    assert statuses == [200] * CAP + [429] * (8 - CAP), [(r.status, r.error) for r in results]
    refused = [r for r in results if r.status == 429]
    assert {r.error["error"]["code"] for r in refused} == {"concurrency_limit_exceeded"}
    assert all(
        r.complete(h.expected(b)) for r, b in zip(results, bodies, strict=True) if r.status == 200
    )


def _kill_the_busiest(names: list[str], killed: list[str]) -> None:
    """ray.kill the ingress replica serving the most streams once it serves 2+ (Serve's
    router decides which replica gets them: a fixed victim may get none; and on a busy
    machine the streams may not have reached any yet); its name goes into `killed`."""
    seen: dict = {}

    def found() -> bool:
        victim = h.busiest_replica(names, 2, seen)
        if victim is not None:
            killed.append(victim)
        return victim is not None

    if h.wait_for(found, 20, step_s=0.1) is not None:
        h.kill_replica(killed[0])


def test_limits_hold_across_ingress_replicas_and_a_killed_one_loses_nothing(base):
    assert len(_ingress_replicas()) == 2
    _check_limit_holds(base)  # 3 in all, not 3 per ingress replica
    assert len(_keeper_state()["owners"]) == 2, "both ingress replicas admitted requests"

    bodies = [h.chat_body(100 + i, words=40) for i in range(24)]
    killed: list[str] = []
    killer = threading.Thread(
        target=_kill_the_busiest, args=(_ingress_replicas(), killed), daemon=True
    )
    killer.start()
    results = asyncio.run(_send(base, FREE, bodies, retries=4))
    killer.join(timeout=30)
    lost = [
        i
        for i, (r, b) in enumerate(zip(results, bodies, strict=True))
        if not r.complete(h.expected(b))
    ]
    assert lost == [], [(results[i].status, results[i].error) for i in lost[:3]]
    retried = sum(r.attempts > 1 for r in results)
    assert retried >= 1, "the killed ingress replica was serving streams: some were cut"
    assert killed and killed[0] not in _ingress_replicas()

    assert h.wait_for(lambda: len(_ingress_replicas()) == 2, 60) is not None
    _check_limit_holds(base)  # the keeper outlives an ingress replica


def test_limits_cost_benchmark_measures_through_the_deployed_keeper(base):
    from agentserve.admission.shared_limits import SharedQuota
    from agentserve_bench.limits_cost import measure
    from ray import serve

    keeper = serve.get_deployment_handle(QUOTA_NAME, h.APP)
    quota = SharedQuota(keeper, replicas=2, owner="limits-cost-test")
    record = asyncio.run(measure(quota, calls=40, concurrency=4))
    assert record["calls"] == 40 and record["admits_per_s"] > 0
    assert 0 < record["admit_p50_ms"] <= record["admit_p95_ms"]
    # measure drained the finishes: every lease of this owner is closed in the book. (Not
    # the book's total: the ingress replicas' own finishes from the test before may still
    # be arriving.)
    assert keeper.renew.remote(quota.owner).result() == 0

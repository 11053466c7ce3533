"""Affinity end to end without a Ray cluster: the ingress puts the key on the engine
request, Ray Serve's own request-router loop (with AffinityRouter and fake replicas)
sends a conversation to one replica, yields under load and forgets a dead replica, and the
model deployment's options name the router only when affinity is on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

from agentserve.engine.protocol import EngineRequest
from agentserve.serve.affinity import AFFINITY_HEADER
from agentserve.serve.affinity_router import ROUTER_PATH, AffinityRouter, request_affinity_key
from agentserve.serve.app import deployment_options
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request
from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest

DEPLOYMENT = DeploymentID(name="m", app_name="a")
TWO = {"min_replicas": 1, "max_replicas": 2}


# -- the ingress side ---------------------------------------------------------------------
class Recording(LocalBackend):
    def __init__(self) -> None:
        super().__init__(FakeEngine("m", 256))
        self.sent: list[EngineRequest] = []

    def generate(self, request: EngineRequest):
        self.sent.append(request)
        return super().generate(request)


def _keys_sent(routing: dict, bodies: list[dict], headers: dict | None = None) -> list:
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "max_model_len": 256, "replicas": TWO, "routing": routing}]}
    )
    backend = Recording()
    app = create_app(spec, {"m": backend})

    async def run() -> None:
        for body in bodies:
            reply = await asgi_request(app, "POST", "/v1/chat/completions", body, headers=headers)
            assert reply.status == 200, reply.text

    asyncio.run(backend.engine.start())
    asyncio.run(run())
    return [r.headers.get(AFFINITY_HEADER) for r in backend.sent]


SYSTEM = {"role": "system", "content": "You are an agent."}
TURN_1 = [SYSTEM, {"role": "user", "content": "one two three"}]
TURN_2 = [*TURN_1, {"role": "assistant", "content": "four"}, {"role": "user", "content": "five"}]
OTHER = [SYSTEM, {"role": "user", "content": "six seven"}]


def _body(messages):
    return {"model": "m", "messages": messages, "max_tokens": 2}


def test_the_ingress_keys_a_conversation_by_its_leading_prompt():
    first, second, other = _keys_sent({}, [_body(TURN_1), _body(TURN_2), _body(OTHER)])
    assert first and first == second  # turn 2 goes where turn 1 went
    assert other and other != first


def test_the_session_header_keys_across_prompts():
    keys = _keys_sent({}, [_body(TURN_1), _body(OTHER)], {"x-session-id": "conv-9"})
    assert keys[0] and keys[0] == keys[1]


def test_affinity_off_sends_no_key():
    assert _keys_sent({"affinity": False}, [_body(TURN_1)]) == [None]


def test_deployment_options_name_the_router_only_with_affinity():
    def options(routing, replicas=TWO):
        spec = DeploymentSpec.model_validate(
            {"models": [{"name": "m", "replicas": replicas, "routing": routing}]}
        )
        return deployment_options(spec.models[0], spec)

    config = options({"max_imbalance_requests": 3})["request_router_config"]
    assert config.request_router_class == ROUTER_PATH
    assert config.request_router_kwargs == {"max_imbalance_requests": 3}
    assert "request_router_config" not in options({"affinity": False})
    single = {"min_replicas": 1, "max_replicas": 1}
    assert "request_router_config" not in options({}, single)  # nothing to choose between


def test_the_default_imbalance_bound_is_a_sixteenth_of_the_batch_slots():
    def bound(model, gpus=0):
        replicas = {**TWO, "num_gpus": gpus}
        spec = DeploymentSpec.model_validate(
            {"models": [{"name": "m", "replicas": replicas, **model}]}
        )
        config = deployment_options(spec.models[0], spec)["request_router_config"]
        return config.request_router_kwargs["max_imbalance_requests"]

    assert bound({"max_num_seqs": 8}) == 0  # a CPU replica: stay only while least loaded
    assert bound({"max_num_seqs": 64}) == 4
    assert bound({}) == 1  # CPU replicas default to 16 slots
    assert bound({}, gpus=1) == 256 // 16  # a GPU replica left at vLLM's default slots
    assert bound({"max_num_seqs": 8, "routing": {"max_imbalance_requests": 3}}) == 3


# -- the router, in Ray Serve's own routing loop -----------------------------------------
@dataclass
class FakeReplica:
    """What Serve's router reads of a replica; `queue_len` is what it reports."""

    name: str
    queue_len: int = 0
    max_ongoing_requests: int = 8
    node_id: str = "node"
    availability_zone: str | None = None
    multiplexed_model_ids: set = field(default_factory=set)
    routing_stats: dict = field(default_factory=dict)
    is_cross_language: bool = False

    @property
    def replica_id(self) -> ReplicaID:
        return ReplicaID(unique_id=self.name, deployment_id=DEPLOYMENT)

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def _pending(key: str | None) -> PendingRequest:
    headers = {AFFINITY_HEADER: key} if key else {}
    request = EngineRequest("r", "chat", SimpleNamespace(), headers)
    metadata = RequestMetadata(request_id=f"id-{key}", internal_request_id=f"i-{id(request)}")
    return PendingRequest(args=[request], kwargs={}, metadata=metadata)


async def _new_router(replicas, max_imbalance=2) -> AffinityRouter:
    router = AffinityRouter(
        deployment_id=DEPLOYMENT,
        handle_source=DeploymentHandleSource.UNKNOWN,
        use_replica_queue_len_cache=True,
    )
    router.initialize_state(max_imbalance_requests=max_imbalance)
    router.update_replicas(replicas)
    return router


async def _send(router: AffinityRouter, key: str | None, sent: list | None = None) -> str:
    """Route one request as Serve's router does; the chosen replica's queue grows. `sent`
    collects (pending request, replica) for completing it later."""
    pending = _pending(key)
    replica = await asyncio.wait_for(router._choose_replica_for_request(pending), 5)
    router.on_request_routed(pending, replica.replica_id, None)
    replica.queue_len += 1
    router.on_new_queue_len_info(replica.replica_id, replica.queue_len)
    if sent is not None:
        sent.append((pending, replica))
    return replica.name


def _complete(router: AffinityRouter, pending: PendingRequest, replica: FakeReplica) -> None:
    replica.queue_len -= 1
    router.on_request_completed(replica.replica_id, pending.metadata.internal_request_id)


def test_a_key_stays_on_its_replica_until_it_is_overloaded():
    async def run():
        a, b = FakeReplica("a"), FakeReplica("b")
        router = await _new_router([a, b], max_imbalance=2)
        home = await _send(router, "conv-1")
        other = b if home == "a" else a
        stays = [await _send(router, "conv-1") for _ in range(2)]  # 2 over the other: ok
        moved = await _send(router, "conv-1")  # 3 over: past the bound
        after = await _send(router, "conv-1")  # the key moved with it
        return home, other.name, stays, moved, after

    home, other, stays, moved, after = asyncio.run(run())
    assert stays == [home, home]
    assert (moved, after) == (other, other)


def test_new_keys_route_as_serves_default_to_the_less_loaded_replica():
    async def run():
        a, b = FakeReplica("a", queue_len=5), FakeReplica("b", queue_len=0)
        router = await _new_router([a, b])
        for replica in (a, b):
            router.on_new_queue_len_info(replica.replica_id, replica.queue_len)
        return [await _send(router, f"new-{n}") for n in range(3)]

    assert asyncio.run(run()) == ["b", "b", "b"]


def test_a_dead_replica_is_forgotten_and_its_keys_move():
    async def run():
        a, b = FakeReplica("a"), FakeReplica("b")
        router = await _new_router([a, b], max_imbalance=100)
        home = await _send(router, "conv-1")
        dead, alive = (a, b) if home == "a" else (b, a)
        router.on_replica_actor_died(dead.replica_id)
        router.update_replicas([alive])
        return await _send(router, "conv-1"), alive.name, router._homes.get("conv-1")

    routed, alive, remembered = asyncio.run(run())
    assert routed == alive
    assert remembered == ReplicaID(unique_id=alive, deployment_id=DEPLOYMENT).to_full_id_str()


def test_requests_without_a_key_route_as_serves_default():
    async def run():
        router = await _new_router([FakeReplica("a"), FakeReplica("b")])
        return [await _send(router, None) for _ in range(4)], len(router._homes)

    names, remembered = asyncio.run(run())
    assert set(names) <= {"a", "b"} and remembered == 0


def test_the_key_is_read_from_the_engine_request_only():
    async def run():  # a PendingRequest holds a future of the running loop
        plain = PendingRequest(args=[], kwargs={}, metadata=_pending("x").metadata)
        return [request_affinity_key(p) for p in (_pending("k1"), _pending(None), None, plain)]

    assert asyncio.run(run()) == ["k1", None, None, None]


def test_an_expired_queue_cache_does_not_hide_a_busy_home():
    """Serve's queue length cache forgets a replica after a few seconds: the requests this
    router sent and that have not completed still count, so the home yields when it is
    busy and takes the key back when its requests complete."""

    async def run():
        a, b = FakeReplica("a"), FakeReplica("b")
        router = await _new_router([a, b], max_imbalance=1)
        sent: list = []
        home = await _send(router, "conv-1", sent)
        await _send(router, "conv-1", sent)  # 2 on the home, 0 on the other: still home
        for replica in (a, b):
            router.replica_queue_len_cache.invalidate_key(replica.replica_id)
        busy = router.replica_load(a if home == "a" else b)
        moved = await _send(router, "conv-1", sent)  # 2 over the other: past the bound
        for pending, replica in sent:
            _complete(router, pending, replica)
            router.replica_queue_len_cache.invalidate_key(replica.replica_id)
        idle = [router.replica_load(r) for r in (a, b)]
        return home, busy, moved, idle

    home, busy, moved, idle = asyncio.run(run())
    assert busy == 2
    assert moved != home
    assert idle == [0, 0]


def test_only_a_key_with_a_home_bypasses_serves_default(monkeypatch):
    """First requests of a key (and keyless ones) go through power of two choices, so
    prompts that share nothing are spread exactly as without affinity."""
    from agentserve.serve import affinity_router

    calls: list = []
    original = affinity_router.PowerOfTwoChoicesRequestRouter.choose_replicas

    async def recording(self, candidate_replicas, pending_request=None):
        calls.append(request_affinity_key(pending_request))
        return await original(
            self, candidate_replicas=candidate_replicas, pending_request=pending_request
        )

    monkeypatch.setattr(
        affinity_router.PowerOfTwoChoicesRequestRouter, "choose_replicas", recording
    )

    async def run():
        router = await _new_router([FakeReplica("a"), FakeReplica("b")], max_imbalance=10)
        first = await _send(router, "conv-1")
        again = [await _send(router, "conv-1") for _ in range(3)]
        await _send(router, "conv-2")
        await _send(router, None)
        return first, again

    first, again = asyncio.run(run())
    assert again == [first] * 3
    assert calls == ["conv-1", "conv-2", None]


def test_a_burst_chosen_before_any_is_routed_still_respects_the_bound():
    """Serve's router chooses for several pending requests before the first is routed (its
    routing tasks run concurrently): a request the router sent home counts on the home from
    the moment it is chosen, so a burst of one key does not pile onto one replica."""

    async def run():
        a, b = FakeReplica("a"), FakeReplica("b")
        router = await _new_router([a, b], max_imbalance=1)
        home = await _send(router, "conv-1")  # routed: 1 on the home, 0 on the other
        burst = [_pending("conv-1") for _ in range(4)]
        firsts = []
        for pending in burst:  # chosen, none routed yet
            ranks = await router.choose_replicas([a, b], pending)
            firsts.append(ranks[0] if len(ranks[0]) == 1 else None)
        home_first = sum(1 for rank in firsts if rank and rank[0].name == home)
        chosen_again = await router.choose_replicas([a, b], burst[0])  # its retry: no double count
        router.on_request_routed(burst[0], (a if home == "a" else b).replica_id, None)
        loads = {r.name: router.replica_load(r) for r in (a, b)}
        return home, home_first, chosen_again, loads

    home, home_first, chosen_again, loads = asyncio.run(run())
    assert home_first == 1  # 1 -> 2 on the home; then 2 > 0 + 1: Serve's default decides
    assert [r.name for r in chosen_again[0]] == [home]  # its own reservation did not count
    assert loads[home] == 2  # the first routed plus the confirmed reservation, once each

"""The held-requests board (serve/held_board.py): what an ingress holds in its deadline
queue, published for the autoscaler, through a dict store here (Ray's GCS store in
serve/gcs_board.py; tests/integration/test_autoscale_held_live.py has the live run)."""

from __future__ import annotations

import asyncio
import time

from agentserve.autoscale.latency_stat import LatencyWindow, bucket_of
from agentserve.serve.backend import LocalBackend
from agentserve.serve.held_board import (
    FORGET_S,
    SKEW_S,
    STALE_S,
    HeldBoard,
    HeldReport,
    MemoryHeldStore,
    read_held,
    sla_scaled_models,
)
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request
from test_priority import KEYS, URL, _body, _spec


class DictStore(MemoryHeldStore):
    """The in-memory store, recording its writes, optionally failing or slow."""

    def __init__(self, fail: bool = False, slow_s: float = 0.0):
        super().__init__()
        self.fail, self.slow_s = fail, slow_s
        self.writes: list[tuple[str, HeldReport]] = []

    def put(self, key: str, value: bytes) -> None:
        if self.fail:
            raise ConnectionError("GCS unreachable")
        time.sleep(self.slow_s)
        super().put(key, value)
        self.writes.append((key, HeldReport.from_json(value)))


def test_a_report_roundtrips_and_reports_of_ingresses_add_up():
    a = HeldReport(10.0, 3, {"chat": LatencyWindow.of([100.0, 2000.0], [])})
    b = HeldReport(
        12.0, 2, {"chat": LatencyWindow.of([100.0], []), "bulk": LatencyWindow.of([5.0], [])}
    )
    assert HeldReport.from_json(a.to_json()) == a
    both = HeldReport.merged([a, b])
    assert (both.at, both.held) == (12.0, 5)
    assert both.tenants["chat"].ttft == {bucket_of(100.0): 2.0, bucket_of(2000.0): 1.0}
    assert both.tenants["chat"].requests == 3 and both.tenants["bulk"].requests == 1
    assert HeldReport.merged([]) is None


def test_the_reader_merges_fresh_publications_only():
    store, now = DictStore(), 1000.0
    store.put("s/m/a", HeldReport(now - 1, 4).to_json())
    store.put("s/m/b", HeldReport(now - 2, 3).to_json())
    store.put("s/m/dead", HeldReport(now - STALE_S - 1, 50).to_json())  # its ingress died
    store.put("s/m/gone", HeldReport(now - FORGET_S - 1, 50).to_json())
    store.put("s/m/ahead", HeldReport(now + SKEW_S + 5, 50).to_json())  # a clock far ahead
    store.put("s/other/a", HeldReport(now, 7).to_json())  # another model
    store.put("s/m%2Ffast/a", HeldReport(now, 9).to_json())  # model "m/fast": not "m"'s
    store.data["s/m/junk"] = b"not json"
    report = read_held(store, "s", "m", now)
    assert report is not None and (report.held, report.at) == (7, now - 1)
    assert "s/m/gone" not in store.data and "s/m/dead" in store.data
    assert read_held(store, "s", "m/fast", now).held == 9
    assert read_held(store, "s", "absent", now) is None


def test_the_board_publishes_its_autoscaled_models_while_requests_wait_then_once_empty():
    store, clock = DictStore(), [100.0]
    waiting = {"m": [("chat", 2.0, 1), ("chat", 0.5, 2)], "fixed": [("chat", 1.0, 1)]}
    board = HeldBoard(store, "s", "i1", lambda: waiting, {"m"}, clock=lambda: clock[0])
    assert board.publish() is True
    assert set(store.data) == {"s/m/i1"}  # a model that does not autoscale: nothing
    report = HeldReport.from_json(store.data["s/m/i1"])
    assert report.held == 3 and report.at == 100.0
    assert report.tenants["chat"] == LatencyWindow.of([2000.0, 500.0], [])
    waiting = {}
    clock[0] += 1
    assert board.publish() is False
    assert HeldReport.from_json(store.data["s/m/i1"]) == HeldReport(101.0, 0, {})
    writes = len(store.writes)
    assert board.publish() is False and len(store.writes) == writes  # idle: writes nothing
    board.close()
    assert store.data == {}  # the ingress stopped: its publications go with it


def test_a_request_that_starts_waiting_during_the_last_write_is_still_published():
    """Review: the final "nothing held" write in flight, a burst starts waiting; the
    wake-up found the task still running and the burst stayed unpublished."""
    store = DictStore(slow_s=0.2)
    waiting: dict = {"m": [("chat", 0.0, 1)]}

    async def run():
        board = HeldBoard(store, "s", "i", lambda: waiting, {"m"}, publish_s=0.05)
        board.wake()
        await asyncio.sleep(0.1)  # first write (held 1) in flight
        waiting.clear()
        await asyncio.sleep(0.3)  # the "nothing held" write starts
        waiting["m"] = [("chat", 0.0, 1)] * 8
        board.wake()  # the task is still running
        await asyncio.sleep(0.8)
        return board

    board = asyncio.run(run())
    assert store.writes[-1][1].held == 8, [w.held for _, w in store.writes]
    board.close()


def _app(spec, store):
    engine = FakeEngine("m", 256, token_delay_s=0.03, accept_per_step=1, max_num_seqs=1)
    app = create_app(spec, {"m": LocalBackend(engine)}, board=(store, "s"))
    app.state.ingress.dispatch_stage.board.publish_s = 0.05  # PUBLISH_S is 1 s
    return engine, app


def _autoscaled(spec: DeploymentSpec) -> DeploymentSpec:
    model = spec.models[0]
    replicas = model.replicas.model_copy(update={"max_replicas": 3})
    return spec.model_copy(update={"models": [model.model_copy(update={"replicas": replicas})]})


def _post(app, who, body):
    return asgi_request(app, "POST", URL, body, headers={"authorization": f"Bearer {KEYS[who]}"})


def test_the_ingress_publishes_the_requests_waiting_for_a_slot():
    """max_num_seqs 1 (two slots on the one replica): five requests, three wait at the
    ingress and are published with their tenant; once all are served the last
    publication holds nothing and the board goes quiet."""
    store = DictStore()
    spec = _autoscaled(_spec())
    assert sla_scaled_models(spec) == ["m"] and sla_scaled_models(_spec()) == []

    async def run():
        engine, app = _app(spec, store)
        await engine.start()
        calls = [asyncio.ensure_future(_post(app, "chat", _body(f"c{i}", 16, words=10)))
                 for i in range(5)]  # fmt: skip
        await asyncio.sleep(0.3)
        during = read_held(store, "s", "m")
        done = await asyncio.gather(*calls)
        await asyncio.sleep(0.2)  # the board's last write
        return during, done, app

    during, done, app = asyncio.run(run())
    assert [c.status for c in done] == [200] * 5
    assert during is not None and during.held == 3, during
    assert during.tenants["chat"].requests == 3
    assert store.writes[-1][1].held == 0 and store.writes[-1][1].tenants == {}
    board = app.state.ingress.dispatch_stage.board
    assert board._task is not None and board._task.done()


def test_a_failing_store_fails_no_request():
    async def run():
        engine, app = _app(_autoscaled(_spec()), DictStore(fail=True))
        await engine.start()
        calls = [_post(app, "chat", _body(f"c{i}", 8, words=6)) for i in range(4)]
        return await asyncio.gather(*calls)

    assert [c.status for c in asyncio.run(run())] == [200] * 4


def test_nothing_is_published_after_close_even_from_a_write_in_flight():
    """Review: close() deleted the keys while a write ran in its thread, which then put a
    fresh publication back for the policy to count after the ingress stopped."""
    store = DictStore(slow_s=0.3)

    async def run():
        board = HeldBoard(store, "s", "i", lambda: {"m": [("chat", 0.0, 1)]}, {"m"})
        board.wake()
        await asyncio.sleep(0.1)  # the first write is in flight
        await board.aclose()
        await asyncio.sleep(0.5)

    asyncio.run(run())
    assert store.data == {}

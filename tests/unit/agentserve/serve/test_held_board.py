"""The held-requests board (serve/held_board.py): what an ingress holds in its deadline
queue, published for the autoscaler and read back by the model replicas, through a dict
store here (Ray's GCS store in serve/gcs_board.py; tests/integration has the live run)."""

from __future__ import annotations

import asyncio

from agentserve.autoscale.latency_stat import LatencyWindow, bucket_of
from agentserve.serve.backend import LocalBackend
from agentserve.serve.held_board import (
    FORGET_S,
    STALE_S,
    HeldBoard,
    HeldReport,
    read_held,
)
from agentserve.serve.ingress import create_app
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request
from test_priority import KEYS, URL, _body, _spec


class DictStore:
    def __init__(self, fail: bool = False):
        self.data: dict[str, bytes] = {}
        self.fail = fail
        self.writes: list[tuple[str, HeldReport]] = []

    def put(self, key: str, value: bytes) -> None:
        if self.fail:
            raise ConnectionError("GCS unreachable")
        self.data[key] = value
        self.writes.append((key, HeldReport.from_json(value)))

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def keys(self, prefix: str) -> list[str]:
        return [k for k in self.data if k.startswith(prefix)]

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


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


def test_the_reader_merges_fresh_publications_ignores_stale_and_forgets_old():
    store = DictStore()
    now = 1000.0
    store.put("s/m/a", HeldReport(now - 1, 4).to_json())
    store.put("s/m/b", HeldReport(now - 2, 3).to_json())
    store.put("s/m/dead", HeldReport(now - STALE_S - 1, 50).to_json())  # its ingress died
    store.put("s/m/gone", HeldReport(now - FORGET_S - 1, 50).to_json())
    store.put("s/other/a", HeldReport(now, 7).to_json())  # another model
    store.data["s/m/junk"] = b"not json"
    report = read_held(store, "s", "m", now)
    assert report is not None and (report.held, report.at) == (7, now - 1)
    assert "s/m/gone" not in store.data and "s/m/dead" in store.data
    assert read_held(store, "s", "absent", now) is None


def test_the_board_publishes_while_requests_wait_then_once_empty():
    store, clock = DictStore(), [100.0]
    waiting = {"m": [("chat", 2.0, 1), ("chat", 0.5, 2)]}
    board = HeldBoard(store, "s", "i1", lambda: waiting, window_s=30.0, clock=lambda: clock[0])
    assert board.publish() is True
    report = HeldReport.from_json(store.data["s/m/i1"])
    assert report.held == 3 and report.at == 100.0
    assert report.tenants["chat"] == LatencyWindow.of([2000.0, 500.0], [])
    board.shed("m", "bulk", 15.0)  # a batch request refused at its 15 s deadline
    waiting = {}
    assert board.publish() is True  # the shed request stays in the window
    report = HeldReport.from_json(store.data["s/m/i1"])
    assert report.held == 0 and report.tenants["bulk"] == LatencyWindow.of([15000.0], [])
    clock[0] += 31.0  # the shed sample leaves the window
    assert board.publish() is False
    assert HeldReport.from_json(store.data["s/m/i1"]) == HeldReport(131.0, 0, {})
    writes = len(store.writes)
    assert board.publish() is False and len(store.writes) == writes  # idle: writes nothing


def _app(spec, store):
    engine = FakeEngine("m", 256, token_delay_s=0.03, accept_per_step=1, max_num_seqs=1)
    app = create_app(spec, {"m": LocalBackend(engine)}, board=(store, "s"))
    app.state.ingress.dispatch_stage.board.publish_s = 0.05  # PUBLISH_S is 1 s
    return engine, app


def _post(app, who, body):
    return asgi_request(app, "POST", URL, body, headers={"authorization": f"Bearer {KEYS[who]}"})


def test_the_ingress_publishes_the_requests_waiting_for_a_slot():
    """max_num_seqs 1 (two slots on the one replica): five requests, three wait at the
    ingress and are published with their tenant; once all are served the last
    publication holds nothing and the board goes quiet."""
    store = DictStore()

    async def run():
        engine, app = _app(_spec(), store)
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


def test_a_shed_batch_request_is_published_and_a_failing_store_fails_no_request():
    store = DictStore()

    async def run(store):
        engine, app = _app(_spec(bulk_ttft_ms=200), store)
        await engine.start()
        busy = [asyncio.ensure_future(_post(app, "chat", _body(f"c{i}", 32, words=20)))
                for i in (0, 1)]  # fmt: skip
        await asyncio.sleep(0.02)
        late = await _post(app, "bulk", _body("late"))
        await asyncio.sleep(0.2)
        shed = read_held(store, "s", "m") if not store.fail else None
        return late, await asyncio.gather(*busy), shed

    late, busy, shed = asyncio.run(run(store))
    assert late.status == 429 and [c.status for c in busy] == [200, 200]
    assert shed is not None and shed.tenants["bulk"] == LatencyWindow.of([200.0], [])
    late, busy, _ = asyncio.run(run(DictStore(fail=True)))
    assert late.status == 429 and [c.status for c in busy] == [200, 200]


def test_a_replica_carries_the_board_in_its_autoscaling_stats():
    from agentserve.autoscale.ray_policy import ingress_held
    from agentserve.engine.protocol import EngineStats
    from agentserve.serve.replica import ModelReplica
    from agentserve.serve.replica_stats import ReplicaStats
    from agentserve.spec import ModelSpec

    store = DictStore()
    store.put("s/m/a", HeldReport(1e12, 6, {"chat": LatencyWindow.of([800.0] * 6, [])}).to_json())
    replica = ModelReplica.__new__(ModelReplica)
    replica.model, replica.board = ModelSpec(name="m"), (store, "s")
    held = asyncio.run(replica._read_held())
    assert held is not None and held.held == 6  # (stamped in the future: still fresh)
    stats = ReplicaStats().autoscaling_stats(EngineStats(), held=held)
    assert ingress_held({"r0": stats}) == (6, {"chat": LatencyWindow.of([800.0] * 6, [])})
    replica.board = (DictStore(fail=True), "s")
    replica.board[0].keys = None  # unreadable: reported without, never raised
    assert asyncio.run(replica._read_held()) is None
    replica.board = None
    assert asyncio.run(replica._read_held()) is None

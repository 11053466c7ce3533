"""The simulator's ingress: earliest deadline first with batch shed past its deadline (the
runtime's serve/priority.py), or first come, first served with priority off."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from agentserve.autoscale.policy import Sla
from agentserve_bench.autoscale.compare import summarize
from agentserve_bench.autoscale.ingress_queue import IngressQueue, QueueClass
from agentserve_bench.autoscale.simulate import SimConfig, simulate
from agentserve_bench.autoscale.trace import Call, Session, Trace, TraceConfig

CLASSES = {"interactive": QueueClass(1.5, "interactive"), "batch": QueueClass(15.0, "batch")}


@dataclass
class _Req:
    tenant: str
    arrival_s: float


def test_queue_sends_the_earliest_deadline_first_and_removes_only_waiting_requests():
    q = IngressQueue(True, CLASSES)
    early_batch, later_batch, interactive = (
        _Req("batch", 0.0),
        _Req("batch", 1.0),
        _Req("interactive", 10.0),
    )
    for r in (early_batch, later_batch, interactive):
        q.push(r)
    assert q.deadline_s(interactive) == 11.5 and q.deadline_s(early_batch) == 15.0
    assert list(q) == [interactive, early_batch, later_batch]
    assert q.remove(early_batch) and not q.remove(early_batch) and len(q) == 2
    assert q.pop() is interactive and q.pop() is later_batch and len(q) == 0
    with pytest.raises(IndexError):
        q.pop()
    assert q.sheds("batch") and not q.sheds("interactive") and not q.sheds("unknown")
    assert q.retry_after_s("batch") == 15.0 and q.retry_after_s("interactive") == 1.5


def test_queue_without_priority_is_first_come_first_served_and_sheds_nothing():
    q = IngressQueue(False, CLASSES)
    batch, interactive = _Req("batch", 0.0), _Req("interactive", 10.0)
    q.push(batch)
    q.push(interactive)
    assert list(q) == [batch, interactive] and not q.sheds("batch")
    q.requeue([_Req("batch", -1.0)])
    assert q.pop().arrival_s == -1.0 and q.pop() is batch


def _trace(batch_calls: int = 1) -> Trace:
    """One replica slot: a long batch call at 0 holds it ~3.5 s; a short batch call at 0.1
    and a short interactive one at 0.2 wait for it."""
    short = Call(prompt_tokens=20, output_tokens=10, pause_s=3.0, new_tokens=20)
    sessions = (
        Session(0, "batch", 0.0, (Call(20, 100, 0.5, 20),)),
        Session(1, "batch", 0.1, (short,) * batch_calls),
        Session(2, "interactive", 0.2, (short,)),
    )
    return Trace(replace(TraceConfig(), duration_s=1.0), sessions)


def _sim(trace: Trace, **kw):
    cfg = SimConfig(max_num_seqs=1, max_drafted=0, initial_replicas=1, tenants=CLASSES)
    return simulate(trace, lambda _s: 1, replace(cfg, **kw))


def _first(result, session_start: float):
    return next(q for q in result.requests if q.arrival_s == session_start)


def test_a_later_interactive_request_is_dispatched_before_an_earlier_batch_one():
    result = _sim(_trace())
    batch, interactive = _first(result, 0.1), _first(result, 0.2)
    assert interactive.first_token_s < batch.first_token_s
    assert all(q.status == "served" for q in result.requests)


def test_priority_off_is_first_come_first_served():
    result = _sim(_trace(), priority=False)
    batch, interactive = _first(result, 0.1), _first(result, 0.2)
    assert batch.first_token_s < interactive.first_token_s
    assert all(q.status == "served" for q in result.requests)
    # a batch objective the wait exceeds sheds nothing without priority
    short = {**CLASSES, "batch": QueueClass(1.0, "batch")}
    assert all(q.status == "served" for q in _sim(_trace(), priority=False, tenants=short).requests)


def test_a_batch_request_waiting_past_its_deadline_is_shed_and_retried_after_retry_after():
    short = {**CLASSES, "batch": QueueClass(1.0, "batch")}
    result = _sim(_trace(), tenants=short)
    shed = _first(result, 0.1)
    assert shed.status == "shed" and shed.shed_s == pytest.approx(1.1)
    assert shed.first_token_s is None and shed.ttft_ms is None
    # Retry-After = the 1 s objective; the slot is still taken, so the first retry is shed
    # too, and the second (the last the SDK makes) is served
    retries = [q for q in result.requests if q.arrival_s > 1.0]
    assert [(q.arrival_s, q.attempt, q.status) for q in retries] == [
        (pytest.approx(2.1), 1, "shed"),
        (pytest.approx(4.1), 2, "served"),
    ]
    # the interactive request waited past its 1.5 s objective too, but is never shed
    interactive = _first(result, 0.2)
    assert interactive.status == "served" and interactive.ttft_ms > 1500
    # a shed request is a miss in the report, and counted as shed
    report = summarize(result, {"batch": Sla(1000.0, 1000.0)}, (0.0, 0.0))
    assert report["tenants"]["batch"]["shed"] == 2
    assert report["tenants"]["batch"]["attainment"] == pytest.approx(2 / 4)


def test_a_call_shed_on_every_try_is_given_up_and_its_session_goes_on():
    short = {**CLASSES, "batch": QueueClass(1.0, "batch")}
    result = _sim(_trace(batch_calls=2), tenants=short, shed_retries=0)
    session = [q for q in result.requests if q.tenant == "batch" and q.arrival_s > 0]
    assert [q.status for q in session] == ["shed", "served"]
    assert session[1].arrival_s == pytest.approx(1.1 + 3.0)  # the next call, after the pause
    assert not any(q.attempt for q in result.requests)

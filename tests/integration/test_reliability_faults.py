"""Fault scenarios on a real local Ray Serve with the fake engine (tests/reliability/faults.py):
replica killed and engine crash mid-stream (migration), stuck engine (health checks),
drain, backpressure, memory soak. The tests assert on the same Outcome the benchmark
records; each control (mechanism switched off) must lose requests, so the checks can fail.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("ray.serve")

from tests.reliability import faults  # noqa: E402
from tests.reliability.serve_harness import local_serve  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_serve():
    """One local Ray + Serve for the module; each scenario deploys and deletes its app."""
    with local_serve(faults.PORT):
        yield


def test_killed_replica_streams_migrate_and_complete():
    outcome = faults.replica_killed_mid_stream()
    details = outcome.details
    assert (outcome.requests, outcome.lost, outcome.errors_5xx) == (100, 0, 0), details
    assert outcome.restarts >= 1, ("Serve replaces the killed replica", details)
    assert details["migrating"]["ongoing_at_kill"][0] >= faults.KILL_AT_ONGOING, details
    assert details["migrating"]["migrations"] >= 1, details
    assert details["control_without_migration"]["lost"] > 0, details


def test_crashed_engine_streams_migrate_and_the_replica_is_replaced():
    outcome = faults.engine_crash_mid_stream()
    assert (outcome.lost, outcome.errors_5xx) == (0, 0), outcome.details
    assert outcome.restarts >= 1 and outcome.details["migrations"] >= 1


def test_stuck_engine_is_replaced_and_its_streams_continue():
    outcome = faults.stuck_engine_replaced()
    assert (outcome.lost, outcome.errors_5xx) == (0, 0), outcome.details
    assert outcome.restarts >= 1 and outcome.details["migrations"] >= 1
    assert outcome.details["slowest_request_s"] < 60, "no wait for the graceful timeout"


def test_stopping_replicas_drain_in_flight_streams():
    outcome = faults.drain_scale_down()
    assert (outcome.lost, outcome.errors_5xx) == (0, 0), outcome.details
    assert outcome.details["control_no_drain"]["lost"] > 0


def test_flood_gets_503_with_retry_after_and_retrying_clients_all_succeed():
    outcome = faults.backpressure_flood()
    first = outcome.details["first_wave"]
    assert first["backpressure_503"] > 0 and first["other"] == 0
    assert first["with_retry_after_and_error_body"] == first["backpressure_503"]
    assert (outcome.lost, outcome.errors_5xx) == (0, 0), outcome.details


def test_soak_completes_everything_with_flat_memory():
    outcome = faults.soak_memory()
    assert (outcome.lost, outcome.errors_5xx) == (0, 0), outcome.details
    assert outcome.details["rss_flat"], outcome.details

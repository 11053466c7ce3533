"""Shared fixtures: `start_up` runs `agentserve up` as a user does (see up_server.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from up_server import UpServer


@pytest.fixture(scope="module")
def start_up(tmp_path_factory) -> Iterator[Callable[..., UpServer]]:
    """start_up(*args, ready_timeout_s=...) -> a ready UpServer; all are stopped at the end."""
    started: list[UpServer] = []

    def start(*args: str, ready_timeout_s: float = 300) -> UpServer:
        server = UpServer(list(args), tmp_path_factory.mktemp("up"))
        started.append(server)
        server.ready = server.wait_for("ready", ready_timeout_s)
        return server

    yield start
    for server in started:
        server.stop()

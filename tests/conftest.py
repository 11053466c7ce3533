"""Shared fixtures: `start_up` runs `agentserve up` as a user does (see up_server.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import hard_exit
import pytest
from up_server import UpServer

hard_exit.install()


def pytest_sessionfinish(session, exitstatus) -> None:
    """The process ends with this session's status once shutdown is done (see hard_exit.py)."""
    hard_exit.remember(session)


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `gpu` skip, with the reason, where no CUDA GPU is visible."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


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


@pytest.fixture
def drafter_dir(tmp_path):
    """A DFlash drafter directory (config.json only) with block size 16: 15 drafts per block.
    (Here, not in tests/unit/conftest.py: that would put tests/unit on sys.path, where
    tests/unit/agentserve/ would shadow the agentserve package as a namespace package.)"""
    from dflash.config import DFlashConfig

    cfg = DFlashConfig(hidden_size=64, vocab_size=96, num_target_layers=4, mask_token_id=95)
    path = tmp_path / "drafter"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return path

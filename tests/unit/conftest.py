"""Fixtures shared by the agentserve and agentserve_bench unit tests."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def drafter_dir(tmp_path):
    """A DFlash drafter directory (config.json only) with block size 16: 15 drafts per block."""
    from dflash.config import DFlashConfig

    cfg = DFlashConfig(hidden_size=64, vocab_size=96, num_target_layers=4, mask_token_id=95)
    path = tmp_path / "drafter"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return path

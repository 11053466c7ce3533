"""Which drafter a served figure was measured with: digests, and the fits' row filter."""

from __future__ import annotations

import pytest
from agentserve.drafters import BUNDLED_DRAFTER_DIR
from agentserve_bench.served_rows import (
    LEGACY_DRAFTER_DIGEST,
    drafter_digest,
    row,
    rows_of_shipped_drafter,
)


def test_the_digest_follows_the_weights_not_the_directory(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"weights")
        (d / "README.md").write_text(f"card of {d.name}")  # not weights: not hashed
    assert drafter_digest(a) == drafter_digest(b) and len(drafter_digest(a)) == 12
    (b / "model.safetensors").write_bytes(b"retrained")
    assert drafter_digest(a) != drafter_digest(b)
    with pytest.raises(FileNotFoundError):
        drafter_digest(tmp_path)
    assert drafter_digest(BUNDLED_DRAFTER_DIR) == drafter_digest(BUNDLED_DRAFTER_DIR)


def test_fits_read_the_shipped_drafters_rows_and_rows_without_a_drafter():
    rows = [
        {"method": "ngram"},
        {"method": "none"},
        {"method": "dflash", "drafter": "new"},
        {"method": "hybrid", "drafter": "old"},
        {"method": "dflash"},  # from before digests: the legacy drafter's
    ]
    assert rows_of_shipped_drafter(rows, "new") == rows[:3]
    assert rows_of_shipped_drafter(rows, LEGACY_DRAFTER_DIGEST) == [*rows[:2], rows[4]]


def test_served_rows_carry_the_drafter_of_dflash_and_hybrid():
    common = {
        "server": "agentserve", "k": 3, "workload": "coding", "concurrency": 1,
        "figures": {}, "counters": {}, "machine": {}, "dtype": "bfloat16",
        "engine_env": {}, "texts": [],
    }  # fmt: skip
    assert row(method="dflash", drafter="abc123", **common)["drafter"] == "abc123"
    assert "drafter" not in row(method="ngram", **common)

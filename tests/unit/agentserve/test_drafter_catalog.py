"""The drafter catalog (drafters/catalog.json): the shipped table and its loader."""

from __future__ import annotations

import json

import pytest
from agentserve.drafters.catalog import CATALOG_PATH, catalog_drafter, load_catalog
from agentserve.sources.models import is_hub_id

ROW = {
    "target": "Org/Target-8B",
    "drafter": "org/Target-8B-DFlash-b8",
    "revision": None,
    "block_size": 8,
    "thinking_off": False,
    "trust_remote_code": False,
    "source": "https://example.invalid/readme",
    "notes": None,
}


def _write(tmp_path, rows):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"drafters": rows}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("target", "drafter", "block", "thinking_off"),
    [
        ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", 16, True),
        ("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", 16, True),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "z-lab/Qwen3-Coder-30B-A3B-DFlash", 16, False),
        (
            "meta-llama/Llama-3.1-8B-Instruct",
            "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
            16,
            False,
        ),
        ("openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash", 16, False),
    ],
)
def test_the_shipped_catalog_lists_the_published_drafters(target, drafter, block, thinking_off):
    entry = catalog_drafter(target)
    assert entry is not None
    assert (entry.drafter, entry.block_size, entry.thinking_off) == (drafter, block, thinking_off)
    assert entry.num_speculative_tokens == block - 1


def test_every_shipped_row_is_a_hub_pairing_with_its_source():
    catalog = load_catalog()
    assert len(catalog) >= 10  # the DFlash release's table, not a sample
    for entry in catalog.values():
        assert is_hub_id(entry.target) and is_hub_id(entry.drafter), entry
        assert entry.drafter.startswith("z-lab/")
        assert entry.source.startswith("https://"), entry
        assert entry.block_size >= 2
    assert CATALOG_PATH.name == "catalog.json" and CATALOG_PATH.is_file()


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("Qwen/Qwen3-8B", True),
        ("qwen/qwen3-8b", True),  # Hub ids are case-insensitive
        ("Qwen/Qwen3-8B-FP8", False),  # another checkpoint: not its drafter's target
        ("/models/Qwen3-8B", False),  # a local directory: no id to match
        ("smollm2-135m-instruct", False),
    ],
)
def test_lookup(source, found):
    assert (catalog_drafter(source) is not None) is found


def test_a_catalog_of_ones_own_is_read_from_its_path(tmp_path):
    catalog = load_catalog(_write(tmp_path, [ROW]))
    entry = catalog_drafter("org/target-8b", catalog)
    assert entry is not None and entry.drafter == ROW["drafter"]
    assert entry.num_speculative_tokens == 7
    assert catalog_drafter("Qwen/Qwen3-8B", catalog) is None


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([{**ROW, "block_size": 1}], "block_size must be >= 2"),
        ([ROW, {**ROW, "target": "org/target-8b"}], "listed twice"),
        ([{k: v for k, v in ROW.items() if k != "block_size"}], "drafters[0]"),
        ([{**ROW, "k": 3}], "drafters[0]"),
    ],
)
def test_a_bad_row_is_refused_naming_it(tmp_path, rows, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        load_catalog(_write(tmp_path, rows))

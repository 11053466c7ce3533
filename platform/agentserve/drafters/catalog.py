"""The drafter catalog: published DFlash drafters by target model, read from catalog.json.

The table is data (catalog.json beside this file, shipped in the package); this module only
reads it. A model whose replicas have GPUs and whose spec leaves its drafter unset
speculates with its target's entry (agentserve.spec.device_defaults.with_catalog_drafters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CATALOG_PATH", "CatalogEntry", "catalog_drafter", "load_catalog"]

CATALOG_PATH = Path(__file__).with_name("catalog.json")


@dataclass(frozen=True)
class CatalogEntry:
    """One published drafter: `target` (Hugging Face id) is drafted for by `drafter`."""

    target: str
    drafter: str
    revision: str | None
    block_size: int
    thinking_off: bool
    trust_remote_code: bool
    source: str
    notes: str | None = None

    @property
    def num_speculative_tokens(self) -> int:
        """Tokens one block drafts: block_size - 1 (the first position is the last verified
        token)."""
        return self.block_size - 1


def load_catalog(path: Path | None = None) -> dict[str, CatalogEntry]:
    """{lower-cased target id: entry} from `path` (default: the shipped catalog.json).

    Raises ValueError naming the row when a row lacks a field, has an unknown one, a block
    smaller than 2, or repeats a target."""
    path = path or CATALOG_PATH
    rows = json.loads(path.read_text(encoding="utf-8"))["drafters"]
    catalog: dict[str, CatalogEntry] = {}
    for i, row in enumerate(rows):
        try:
            entry = CatalogEntry(**row)
        except TypeError as err:
            raise ValueError(f"{path}: drafters[{i}]: {err}") from None
        key = entry.target.lower()
        if entry.block_size < 2:
            raise ValueError(f"{path}: drafters[{i}] ({entry.target}): block_size must be >= 2")
        if key in catalog:
            raise ValueError(f"{path}: drafters[{i}]: target {entry.target} is listed twice")
        catalog[key] = entry
    return catalog


def catalog_drafter(
    source: str, catalog: dict[str, CatalogEntry] | None = None
) -> CatalogEntry | None:
    """The catalog's drafter for the model `source` (a Hugging Face id, matched without
    regard to case), or None: local directories and uncatalogued ids have none."""
    catalog = load_catalog() if catalog is None else catalog
    return catalog.get(source.strip().lower())

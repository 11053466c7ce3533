"""The feature shards' order survives a growing data set: records added later are
featurized after the ones done, each exactly once."""

from __future__ import annotations

import random

import pytest
import torch

from dflash.train.features import FeatureStore, extract_features, feature_order

LAYERS = [1]
MAX_LEN = 64


def _records(n: int, start: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(start + n):
        prompt = torch.randint(0, 90, (3 + i % 4,), generator=g).tolist()
        response = torch.randint(0, 90, (5 + i % 3,), generator=g).tolist()
        out.append({"id": f"r{i:03d}", "prompt_ids": prompt, "response_ids": response})
    return out[start:]


def _stored(directory) -> list[list[int]]:
    return [t.tolist() for t in FeatureStore(directory).tokens]


def _seq(rec: dict) -> list[int]:
    return rec["prompt_ids"] + rec["response_ids"]


def test_records_added_later_go_after_the_featurized_ones_each_once(tiny_target, tmp_path):
    first = _records(10)
    order = feature_order(first, tmp_path, 0, MAX_LEN)
    assert sorted(r["id"] for r in order) == [r["id"] for r in first]
    assert [r["id"] for r in order] != [r["id"] for r in first]  # shuffled
    extract_features(tiny_target, order, LAYERS, tmp_path, shard_size=4, progress=False)
    assert _stored(tmp_path) == [_seq(r) for r in order]

    grown = first + _records(7, start=10)
    regrown = feature_order(grown, tmp_path, 0, MAX_LEN)
    assert regrown[:10] == order  # the featurized prefix keeps its place
    assert {r["id"] for r in regrown[10:]} == {f"r{i:03d}" for i in range(10, 17)}
    extract_features(tiny_target, regrown, LAYERS, tmp_path, shard_size=4, progress=False)
    # the last old shard held 2 sequences: resuming counts sequences, not shards
    assert _stored(tmp_path) == [_seq(r) for r in regrown]
    assert len({tuple(s) for s in _stored(tmp_path)}) == 17


def test_a_directory_from_before_the_order_file_is_read_as_its_seeded_shuffle(
    tiny_target, tmp_path
):
    old = _records(9)
    shuffled = list(old)
    random.Random(0).shuffle(shuffled)  # how the shards used to be ordered
    extract_features(tiny_target, shuffled, LAYERS, tmp_path, shard_size=4, progress=False)
    order = feature_order(old + _records(3, start=9), tmp_path, 0, MAX_LEN)
    assert order[:9] == shuffled


def test_shards_from_other_data_are_refused(tiny_target, tmp_path):
    other = _records(6, start=20)
    extract_features(tiny_target, other, LAYERS, tmp_path, shard_size=4, progress=False)
    with pytest.raises(ValueError, match="made from other data"):
        feature_order(_records(6), tmp_path, 0, MAX_LEN)

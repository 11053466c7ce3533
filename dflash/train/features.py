"""Precompute target features for training: one forward per sequence, stored as bf16 shards.

For each (prompt + response) sequence the target's outputs at `layer_ids` are concatenated
per position ([T, len(layer_ids) * H]) and saved with the token ids and the response start.
With `topk` > 0 the target's `topk` most likely next tokens and their log-probabilities
(temperature 1) are kept per position too: the soft labels of distillation, which teach
the drafter the target's whole distribution where greedy labels give one token (what
sampled verification accepts). The drafter then trains for many epochs without running the
target again.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflash.target import TargetModel

__all__ = ["FeatureStore", "extract_features", "feature_order"]


def _shard_path(directory: Path, index: int) -> Path:
    return directory / f"features-{index:05d}.safetensors"


@torch.inference_mode()
def extract_features(
    target: TargetModel,
    records: list[dict[str, Any]],
    layer_ids: list[int],
    out_dir: str | Path,
    *,
    shard_size: int = 256,
    max_len: int = 512,
    topk: int = 0,
    progress: bool = True,
) -> int:
    """Write shards of {features_i, tokens_i, start_i} (+ topk_ids_i, topk_logp_i [T, topk]
    when topk > 0); resumes after the sequences the complete shards hold, so records
    appended since (a grown data set, in `feature_order`) go into new shards."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = sorted(out_dir.glob("features-*.safetensors"))
    done = _sequences_in(shards)
    bar = tqdm(
        total=len(records), initial=min(done, len(records)), desc="features", unit="seq",
        disable=not progress,
    )  # fmt: skip
    stop_layer = None if topk else max(layer_ids) + 1
    todo = records[done:]
    for n, start in enumerate(range(0, len(todo), shard_size)):
        shard = len(shards) + n
        tensors: dict[str, torch.Tensor] = {}
        for i, rec in enumerate(todo[start : start + shard_size]):
            ids = (rec["prompt_ids"] + rec["response_ids"])[:max_len]
            tokens = torch.tensor(ids)[None]
            cache = target.new_cache(1, len(ids))
            out = target(tokens, cache, feature_layers=layer_ids, stop_after_layer=stop_layer)
            tensors[f"features_{i}"] = out.features[0].to(torch.bfloat16).contiguous()
            tensors[f"tokens_{i}"] = tokens[0]
            tensors[f"start_{i}"] = torch.tensor([len(rec["prompt_ids"])])
            if topk:
                logp, ids = out.logits[0].float().log_softmax(-1).topk(topk, dim=-1)
                tensors[f"topk_ids_{i}"] = ids.to(torch.int32).contiguous()
                tensors[f"topk_logp_{i}"] = logp.to(torch.bfloat16).contiguous()
            bar.update(1)
        tmp = _shard_path(out_dir, shard).with_suffix(".tmp")
        save_file(tensors, tmp)
        tmp.rename(_shard_path(out_dir, shard))
    bar.close()
    return len(records)


def _rows(shard) -> int:
    return sum(1 for k in shard.keys() if k.startswith("tokens_"))  # noqa: SIM118 (no __iter__)


def _sequences_in(shards: list[Path]) -> int:
    total = 0
    for path in shards:
        with safe_open(path, framework="pt") as shard:
            total += _rows(shard)
    return total


ORDER_FILE = "order.json"


def feature_order(
    records: list[dict[str, Any]], out_dir: str | Path, seed: int, max_len: int
) -> list[dict[str, Any]]:
    """The records in the order the shards hold them: a seeded shuffle, so any prefix of
    the shards is a representative mix of sources, kept in `order.json` so that records
    added later (a grown data set) are shuffled among themselves and go after the ones
    already featurized, never between them. A directory made before the order file is
    read as the seeded shuffle of the first records of the file, checked against the
    shards' tokens."""
    out_dir = Path(out_dir)
    path = out_dir / ORDER_FILE
    by_id = {r["id"]: r for r in records}
    if path.exists():
        kept = json.loads(path.read_text())
    else:
        done = _sequences_in(sorted(out_dir.glob("features-*.safetensors")))
        kept = [r["id"] for r in records[:done]]
        random.Random(seed).shuffle(kept)
    missing = [i for i in kept if i not in by_id]
    if missing:
        raise ValueError(f"{len(missing)} featurized records are gone (first: {missing[0]})")
    known = set(kept)
    rest = [r["id"] for r in records if r["id"] not in known]
    random.Random(seed + len(kept)).shuffle(rest)
    order = [by_id[i] for i in kept + rest]
    _check_shards(order, out_dir, max_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept + rest))
    return order


def _check_shards(order: list[dict[str, Any]], out_dir: Path, max_len: int) -> None:
    """Each shard's first and last sequences are the records `order` puts there."""
    at = 0
    for path in sorted(out_dir.glob("features-*.safetensors")):
        with safe_open(path, framework="pt") as shard:
            count = _rows(shard)
            for row in {0, count - 1}:
                rec = order[at + row] if at + row < len(order) else None
                want = None if rec is None else (rec["prompt_ids"] + rec["response_ids"])[:max_len]
                if want != shard.get_tensor(f"tokens_{row}").tolist():
                    raise ValueError(
                        f"{path.name} row {row} is not the record the order puts there: the "
                        f"features in {out_dir} were made from other data; remove the directory "
                        "to extract them again"
                    )
        at += count


class _ShardedFeatures:
    """features[i] read on demand from the memory-mapped shards (the whole set of long
    code-context sequences is larger than RAM; the page cache keeps the hot part)."""

    def __init__(self, index: list[tuple[Path, int]], name: str = "features") -> None:
        self._index = index
        self._name = name
        self._open: dict[Path, object] = {}

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> torch.Tensor:
        path, row = self._index[i]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt")
        return self._open[path].get_tensor(f"{self._name}_{row}")


class FeatureStore:
    """Per sequence: features [T, F] bf16 (read lazily), tokens [T], response start, and
    (`has_topk`) the target's top-k next-token ids and log-probabilities [T, k]."""

    def __init__(self, directory: str | Path) -> None:
        index: list[tuple[Path, int]] = []
        self.tokens: list[torch.Tensor] = []
        self.starts: list[int] = []
        with_topk = []
        for path in sorted(Path(directory).glob("features-*.safetensors")):
            with safe_open(path, framework="pt") as shard:
                keys = set(shard.keys())
                count = sum(1 for k in keys if k.startswith("tokens_"))
                with_topk.append("topk_ids_0" in keys)
                for i in range(count):
                    index.append((path, i))
                    self.tokens.append(shard.get_tensor(f"tokens_{i}"))
                    self.starts.append(int(shard.get_tensor(f"start_{i}")[0]))
        if not self.tokens:
            raise FileNotFoundError(f"no feature shards in {directory}")
        self.features = _ShardedFeatures(index)
        self.has_topk = all(with_topk)
        self.topk_ids = _ShardedFeatures(index, "topk_ids") if self.has_topk else None
        self.topk_logp = _ShardedFeatures(index, "topk_logp") if self.has_topk else None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

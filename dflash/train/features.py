"""Precompute target features for training: one forward per sequence, stored as bf16 shards.

For each (prompt + response) sequence the target's outputs at `layer_ids` are concatenated
per position ([T, len(layer_ids) * H]) and saved with the token ids and the response start.
The drafter then trains for many epochs without running the target again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflash.target import TargetModel

__all__ = ["FeatureStore", "extract_features"]


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
    progress: bool = True,
) -> int:
    """Write shards of {features_i, tokens_i, start_i}; resumes after the last complete shard."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done_shards = len(list(out_dir.glob("features-*.safetensors")))
    bar = tqdm(
        total=len(records),
        initial=min(done_shards * shard_size, len(records)),
        desc="features",
        unit="seq",
        disable=not progress,
    )
    stop_layer = max(layer_ids) + 1
    for shard in range(done_shards, (len(records) + shard_size - 1) // shard_size):
        tensors: dict[str, torch.Tensor] = {}
        for i, rec in enumerate(records[shard * shard_size : (shard + 1) * shard_size]):
            ids = (rec["prompt_ids"] + rec["response_ids"])[:max_len]
            tokens = torch.tensor(ids)[None]
            cache = target.new_cache(1, len(ids))
            out = target(tokens, cache, feature_layers=layer_ids, stop_after_layer=stop_layer)
            tensors[f"features_{i}"] = out.features[0].to(torch.bfloat16).contiguous()
            tensors[f"tokens_{i}"] = tokens[0]
            tensors[f"start_{i}"] = torch.tensor([len(rec["prompt_ids"])])
            bar.update(1)
        tmp = _shard_path(out_dir, shard).with_suffix(".tmp")
        save_file(tensors, tmp)
        tmp.rename(_shard_path(out_dir, shard))
    bar.close()
    return len(records)


class _ShardedFeatures:
    """features[i] read on demand from the memory-mapped shards (the whole set of long
    code-context sequences is larger than RAM; the page cache keeps the hot part)."""

    def __init__(self, index: list[tuple[Path, str]]) -> None:
        self._index = index
        self._open: dict[Path, object] = {}

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> torch.Tensor:
        path, key = self._index[i]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt")
        return self._open[path].get_tensor(key)


class FeatureStore:
    """Per sequence: features [T, F] bf16 (read lazily), tokens [T], response start."""

    def __init__(self, directory: str | Path) -> None:
        index: list[tuple[Path, str]] = []
        self.tokens: list[torch.Tensor] = []
        self.starts: list[int] = []
        for path in sorted(Path(directory).glob("features-*.safetensors")):
            with safe_open(path, framework="pt") as shard:
                count = sum(1 for k in shard.keys() if k.startswith("tokens_"))  # noqa: SIM118
                for i in range(count):
                    index.append((path, f"features_{i}"))
                    self.tokens.append(shard.get_tensor(f"tokens_{i}"))
                    self.starts.append(int(shard.get_tensor(f"start_{i}")[0]))
        if not self.tokens:
            raise FileNotFoundError(f"no feature shards in {directory}")
        self.features = _ShardedFeatures(index)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

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
    topk: int = 0,
    progress: bool = True,
) -> int:
    """Write shards of {features_i, tokens_i, start_i} (+ topk_ids_i, topk_logp_i [T, topk]
    when topk > 0); resumes after the last complete shard."""
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
    stop_layer = None if topk else max(layer_ids) + 1
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

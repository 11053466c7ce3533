"""Save and load drafters as checkpoint directories that vLLM's `dflash` method loads.

A directory holds config.json (DFlashConfig.to_hf_dict: a Qwen3 config + dflash_config) and
model.safetensors with the drafter's own weights only (no embeddings; no LM head unless the
drafter has a reduced vocabulary, then `lm_head.weight` and the int64 `d2t` map). Past
`max_shard_bytes` the weights are sharded the Hugging Face way (model-00001-of-0000N.safetensors
+ model.safetensors.index.json), which vLLM and transformers read. Published checkpoints in
the same format load here too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dflash.config import DFlashConfig
from dflash.model import DFlashDrafter

__all__ = ["load_drafter", "save_drafter", "shard"]

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
MASK_EMBEDDING = "mask_embedding.pt"
REMOTE_CODE = Path(__file__).with_name("hf_remote_code.py")
# Names some published checkpoints use for the same tensors.
_ALIASES = {
    "midlayer.": "layers.0.",
    "encoder.fc.": "fc.",
    "encoder.output_norm_enc.": "hidden_norm.",
}
_SHARED = ("embed_tokens.", "lm_head.")  # the target's; ignored when a checkpoint ships them


def save_drafter(
    drafter: DFlashDrafter,
    directory: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write config.json + weights atomically (temp dir, then rename); shard the weights
    when they exceed `max_shard_bytes` (None: one file)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    state = {
        k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous().cpu()
        for k, v in drafter.state_dict().items()
    }
    _save_weights(state, tmp, max_shard_bytes)
    (tmp / "config.json").write_text(json.dumps(drafter.config.to_hf_dict(), indent=2) + "\n")
    shutil.copyfile(REMOTE_CODE, tmp / "dflash.py")  # config auto_map: AutoModel loads it
    for file in tmp.iterdir():  # safetensors writes 0600; a checkpoint is shared, read-only data
        file.chmod(0o644)
    if directory.exists():
        for old in directory.iterdir():
            if old.suffix == ".safetensors" or old.name in (INDEX, "config.json", "dflash.py"):
                old.unlink()
        for new in tmp.iterdir():
            os.replace(new, directory / new.name)
        tmp.rmdir()
    else:
        os.replace(tmp, directory)
    return directory


def shard(state: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    """Split `state` in order into groups of at most `max_bytes` (a bigger tensor: alone)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_bytes is not None and shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def _save_weights(state: dict[str, torch.Tensor], directory: Path, max_bytes: int | None) -> None:
    shards = shard(state, max_bytes)
    if len(shards) == 1:
        save_file(state, directory / WEIGHTS, metadata={"format": "pt"})
        return
    weight_map = {}
    for i, part in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, directory / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _weight_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files: the index's when there is one, else all."""
    if (directory / INDEX).is_file():
        weight_map = json.loads((directory / INDEX).read_text())["weight_map"]
        files = [directory / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{directory / INDEX} names missing shards: {absent}")
        return files
    return sorted(directory.glob("*.safetensors"))


def _canonical(name: str) -> str:
    name = name.removeprefix("model.")
    for old, new in _ALIASES.items():
        name = name.replace(old, new)
    return name


def load_drafter(
    directory: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> DFlashDrafter:
    """Build a drafter from a checkpoint directory; raise ValueError on any missing weight."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} is not a DFlash drafter directory (no config.json)")
    drafter = DFlashDrafter(DFlashConfig.load(directory))
    shared = ("embed_tokens.",) if drafter.own_head else _SHARED
    files = _weight_files(directory)
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(file).items():
            if not name.startswith(shared) and not _canonical(name).startswith(shared):
                state[_canonical(name)] = tensor
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"drafter weights in {directory} do not match its config: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    drafter.mask_embedding = _mask_embedding(directory, drafter.config)
    drafter = drafter.to(device=device, dtype=dtype).eval()
    if drafter.own_head:
        ids = drafter.draft_token_ids()
        if ids.min() < 0 or ids.max() >= drafter.config.vocab_size or len(ids.unique()) < len(ids):
            raise ValueError(f"d2t in {directory} does not map to distinct target token ids")
    return drafter


def _mask_embedding(directory: Path, cfg: DFlashConfig) -> torch.Tensor | None:
    """A published checkpoint's separately trained mask embedding, checked like vLLM does."""
    path = directory / MASK_EMBEDDING
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True, map_location="cpu")
    if isinstance(state, dict):
        if state.get("mask_token_id", cfg.mask_token_id) != cfg.mask_token_id:
            raise ValueError(
                f"{path}: mask_token_id {state.get('mask_token_id')} does not match "
                f"dflash_config.mask_token_id {cfg.mask_token_id}"
            )
        state = state["embedding"]
    vector = state.reshape(-1)
    if vector.numel() != cfg.hidden_size:
        raise ValueError(
            f"{path}: embedding has {vector.numel()} values, hidden_size is {cfg.hidden_size}"
        )
    return vector.float()

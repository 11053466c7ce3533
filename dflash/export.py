"""Save and load drafters as checkpoint directories that vLLM's `dflash` method loads.

A directory holds config.json (DFlashConfig.to_hf_dict: a Qwen3 config + dflash_config) and
model.safetensors with the drafter's own weights only (no embeddings, no LM head: vLLM
shares the target's). Published checkpoints in the same format load here too.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dflash.config import DFlashConfig
from dflash.model import DFlashDrafter

__all__ = ["load_drafter", "save_drafter"]

WEIGHTS = "model.safetensors"
# Names some published checkpoints use for the same tensors.
_ALIASES = {
    "midlayer.": "layers.0.",
    "encoder.fc.": "fc.",
    "encoder.output_norm_enc.": "hidden_norm.",
}
_SHARED = ("embed_tokens.", "lm_head.")  # the target's; ignored when a checkpoint ships them


def save_drafter(
    drafter: DFlashDrafter, directory: str | Path, dtype: torch.dtype = torch.bfloat16
) -> Path:
    """Write config.json + model.safetensors atomically (temp dir, then rename)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in drafter.state_dict().items()}
    save_file(state, tmp / WEIGHTS, metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(drafter.config.to_hf_dict(), indent=2) + "\n")
    if directory.exists():
        for old in directory.iterdir():
            if old.name in (WEIGHTS, "config.json"):
                old.unlink()
        for new in tmp.iterdir():
            os.replace(new, directory / new.name)
        tmp.rmdir()
    else:
        os.replace(tmp, directory)
    return directory


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
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(file).items():
            if not name.startswith(_SHARED) and not _canonical(name).startswith(_SHARED):
                state[_canonical(name)] = tensor
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"drafter weights in {directory} do not match its config: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return drafter.to(device=device, dtype=dtype).eval()

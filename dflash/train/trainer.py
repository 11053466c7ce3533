"""Train a DFlash drafter on cached target features: AdamW, warmup + cosine, checkpoints.

The target's embeddings (and its LM head, unless the drafter has its own reduced head) are
frozen inputs; only the drafter's own weights train. Runs under bf16 autocast (fast on CPUs
with AMX/AVX512-bf16 and on GPUs), keeps fp32 master weights, and checkpoints so a stopped
job resumes.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dflash.model import DFlashDrafter
from dflash.target import TargetModel
from dflash.train.features import FeatureStore
from dflash.train.loss import OUT_OF_VOCAB, block_loss, position_weights
from dflash.train.masks import IGNORE, block_inputs, sample_anchors, training_mask

__all__ = ["TrainConfig", "init_from_target", "select_draft_vocab", "train", "warm_start_from"]


@dataclass
class TrainConfig:
    steps: int = 3000
    batch_size: int = 4  # sequences per step
    blocks_per_seq: int = 16  # anchors per sequence
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    gamma: float = 7.0  # position-weight decay
    seed: int = 0
    log_every: int = 20
    checkpoint_every: int = 200
    autocast_bf16: bool = True


def init_from_target(drafter: DFlashDrafter, target: TargetModel, layers: list[int]) -> None:
    """Warm start: copy target layers' attention/MLP/norm weights into the drafter layers.

    Shapes must agree (same hidden, heads, head_dim, intermediate). q/k norms and
    hidden_norm start at identity; the final norm copies the target's.
    """
    with torch.no_grad():
        for mine, index in zip(drafter.layers, layers, strict=True):
            theirs = target.layers[index]
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(mine.self_attn, name).weight.copy_(getattr(theirs.self_attn, name).weight)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(mine.mlp, name).weight.copy_(getattr(theirs.mlp, name).weight)
            mine.input_layernorm.weight.copy_(theirs.input_layernorm.weight)
            mine.post_attention_layernorm.weight.copy_(theirs.post_attention_layernorm.weight)
        drafter.norm.weight.copy_(target.norm.weight)


def warm_start_from(drafter: DFlashDrafter, directory) -> bool:
    """Copy a saved drafter's weights (layers, fc, norms) into `drafter`; its own reduced
    head (if any) keeps its initialisation. False, and nothing copied, when the shapes of
    the shared weights differ (other layer count, feature layers or sizes)."""
    from dflash.export import load_drafter

    source = load_drafter(directory).state_dict()
    mine = drafter.state_dict()
    shared = {k: v for k, v in source.items() if k not in ("lm_head.weight", "d2t")}
    if any(k not in mine or mine[k].shape != v.shape for k, v in shared.items()):
        return False
    if any(k not in shared for k in mine if k not in ("lm_head.weight", "d2t")):
        return False
    drafter.load_state_dict(shared, strict=False)
    return True


def _lr(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def _batch(
    store: FeatureStore,
    rows: list[int],
    drafter: DFlashDrafter,
    embed: torch.Tensor,
    cfg: TrainConfig,
    g: torch.Generator,
):
    """Padded tensors for one step: features, positions, block embeds, mask, labels."""
    dc = drafter.config
    size = dc.block_size
    ctx_len = max(len(store.tokens[r]) for r in rows)
    feats, ctx_pos, embeds, pos, masks, labels = [], [], [], [], [], []
    for r in rows:
        tokens, length = store.tokens[r], len(store.tokens[r])
        anchors = sample_anchors(store.starts[r], length, cfg.blocks_per_seq, g)
        inputs, positions, lab = block_inputs(tokens, anchors, size, dc.mask_token_id)
        feats.append(torch.nn.functional.pad(store.features[r], (0, 0, 0, ctx_len - length)))
        ctx_pos.append(torch.arange(ctx_len))
        embeds.append(embed[inputs.reshape(-1)])
        pos.append(positions.reshape(-1))
        masks.append(training_mask(anchors, ctx_len, size))
        labels.append(lab)
    return (
        torch.stack(feats),
        torch.stack(ctx_pos),
        torch.stack(embeds),
        torch.stack(pos),
        torch.stack(masks)[:, None],
        torch.stack(labels),
    )


def _label_map(drafter: DFlashDrafter):
    """Target token ids -> rows of the head being trained (reduced: OUT_OF_VOCAB if absent)."""
    if not drafter.own_head:
        return lambda labels: labels
    table = torch.full((drafter.config.vocab_size,), OUT_OF_VOCAB, dtype=torch.long)
    ids = drafter.draft_token_ids().cpu()
    table[ids] = torch.arange(len(ids))

    def to_row(labels: torch.Tensor) -> torch.Tensor:
        return torch.where(labels == IGNORE, IGNORE, table[labels.clamp_min(0)])

    return to_row


def select_draft_vocab(
    token_lists, vocab_size: int, size: int, always: tuple[int, ...] = ()
) -> tuple[torch.Tensor, float]:
    """The `size` most frequent token ids in `token_lists` (`always` included first), sorted,
    and the fraction of all those tokens they cover."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for tokens in token_lists:
        counts += torch.bincount(torch.as_tensor(tokens, dtype=torch.long), minlength=vocab_size)
    rank = counts.clone()
    rank[list(always)] = counts.sum() + 1
    picked = rank.topk(size).indices.sort().values
    return picked, float(counts[picked].sum() / counts.sum().clamp_min(1))


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(
    drafter: DFlashDrafter,
    target: TargetModel,
    store: FeatureStore,
    cfg: TrainConfig,
    out_dir: str | Path,
    progress: bool = True,
) -> DFlashDrafter:
    """Train (resuming from out_dir/checkpoint.pt if present); logs to out_dir/train_log.jsonl."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, log_path = out_dir / "checkpoint.pt", out_dir / "train_log.jsonl"
    embed = target.embed_tokens.weight.detach().float()
    to_row = _label_map(drafter)
    weights = position_weights(drafter.config.block_size, cfg.gamma)
    drafter.float().train()
    opt = torch.optim.AdamW(
        drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95)
    )
    step, g, order = 0, torch.Generator().manual_seed(cfg.seed), list(range(len(store)))
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        g.set_state(state["generator"])
    (out_dir / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    rng = random.Random(cfg.seed + step)
    bar = tqdm(
        total=cfg.steps, initial=step, desc="train drafter", unit="step", disable=not progress
    )
    window: list[float] = []
    correct = torch.zeros(drafter.config.block_size)
    valid = torch.zeros(drafter.config.block_size)
    started = time.perf_counter()
    while step < cfg.steps:
        rows = rng.sample(order, cfg.batch_size)
        feats, ctx_pos, embeds, pos, mask, labels = _batch(store, rows, drafter, embed, cfg, g)
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast_bf16):
            ctx = drafter.context_kv(drafter.project_context(feats), ctx_pos)
            hidden = drafter(embeds, pos, ctx, mask)  # [B, A*S, H]
            size = drafter.config.block_size
            loss, c, v = block_loss(
                hidden.reshape(-1, size, hidden.shape[-1]),
                drafter.lm_head.weight if drafter.own_head else target.lm_head.weight.detach(),
                to_row(labels.reshape(-1, size)),
                weights,
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        window.append(loss.item())
        correct += c.cpu()
        valid += v.cpu()
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            acc = (correct / valid.clamp_min(1)).tolist()
            record = {
                "step": step,
                "loss": sum(window) / len(window),
                "lr": _lr(cfg, step - 1),
                "acc_per_position": [round(a, 4) for a in acc[1:]],
                "elapsed_s": round(time.perf_counter() - started, 1),
            }
            with log_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc1=f"{acc[1]:.2f}")
            window.clear()
            correct.zero_()
            valid.zero_()
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            _save(
                ckpt_path,
                {
                    "drafter": drafter.state_dict(),
                    "optimizer": opt.state_dict(),
                    "step": step,
                    "generator": g.get_state(),
                },
            )
    bar.close()
    return drafter.eval()

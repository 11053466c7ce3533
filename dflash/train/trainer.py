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
from dflash.train.batches import length_groups, make_batch, rows_for_step
from dflash.train.features import FeatureStore
from dflash.train.heldout import teacher_forced_acceptance
from dflash.train.loss import OUT_OF_VOCAB, block_loss, position_weights
from dflash.train.masks import IGNORE

__all__ = [
    "TrainConfig",
    "grown_layers",
    "init_from_target",
    "select_draft_vocab",
    "train",
    "warm_start_from",
]


@dataclass
class TrainConfig:
    steps: int = 3000
    batch_size: int = 4  # sequences per step (anchors "sampled")
    blocks_per_seq: int = 16  # anchors per sequence (anchors "sampled")
    anchors: str = "sampled"  # or "all": every response position, length-grouped batches
    step_budget: int = 4096  # anchors "all": rows x most anchors x (1 + context / 256)
    distill: float = 0.0  # weight of the top-k distillation term (needs top-k features)
    # blocks trained, in turn, step by step (default: the drafter's block size only): a
    # drafter served at several k sees k + 1 query slots, so it trains on each of them
    block_sizes: tuple[int, ...] | None = None
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
    """Copy a saved drafter's weights (layers, fc, norms) into `drafter`, and its own reduced
    head's rows for the tokens both draft vocabularies hold (a vocabulary recounted over
    more data keeps what was learned; the other rows keep their initialisation). A drafter
    with more layers than the saved one is grown (`grown_layers`): it starts out drafting
    exactly what the saved one does. False, and nothing copied, when the shapes of the
    shared weights differ (fewer layers, other feature layers or sizes)."""
    from dflash.export import load_drafter

    source = load_drafter(directory).state_dict()
    mine = drafter.state_dict()
    shared = {k: v for k, v in source.items() if k not in ("lm_head.weight", "d2t")}
    shared = grown_layers(shared, _layer_count(mine))
    if any(k not in mine or mine[k].shape != v.shape for k, v in shared.items()):
        return False
    if any(k not in shared for k in mine if k not in ("lm_head.weight", "d2t")):
        return False
    head = _shared_head_rows(source, mine)
    if head is not None:
        shared["lm_head.weight"] = head
    drafter.load_state_dict(shared, strict=False)
    return True


def _shared_head_rows(
    source: dict[str, torch.Tensor], mine: dict[str, torch.Tensor]
) -> torch.Tensor | None:
    """`mine`'s reduced head with the saved head's trained row for every token both draft
    vocabularies hold (all rows when they are the same); None when either head is not a
    reduced one or their widths differ."""
    if "d2t" not in source or "d2t" not in mine:
        return None
    theirs, head = source["lm_head.weight"], mine["lm_head.weight"].clone()
    if theirs.shape[1:] != head.shape[1:]:
        return None
    their_ids = torch.arange(len(source["d2t"])) + source["d2t"].cpu()  # sorted (d2t's rule)
    my_ids = torch.arange(len(mine["d2t"])) + mine["d2t"].cpu()
    at = torch.searchsorted(their_ids, my_ids).clamp(max=len(their_ids) - 1)
    found = their_ids[at] == my_ids
    head[found] = theirs[at[found]].to(head.dtype)
    return head


def _layer_count(state: dict[str, torch.Tensor]) -> int:
    return len({key.split(".")[1] for key in state if key.startswith("layers.")})


def grown_layers(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """A drafter's weights with layers appended up to `layers`, each a copy of its last
    layer whose output projections (o_proj, down_proj) are zero: the added layers leave
    the residual stream as it is, so the grown drafter computes what the saved one did
    (function-preserving growth) and training goes on from its acceptance, not from
    scratch. `state` itself when it has at least `layers` layers (or none)."""
    have = _layer_count(state)
    if not have or have >= layers:
        return state
    last = f"layers.{have - 1}."
    out = dict(state)
    for i in range(have, layers):
        for key, value in state.items():
            if key.startswith(last):
                name = key[len(last) :]
                zero = name in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
                out[f"layers.{i}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    return out


def _lr(cfg: TrainConfig, step: int, total: int | None = None) -> float:
    """Warmup, then cosine to min_lr_ratio at `total` (default cfg.steps), flat after it."""
    total = cfg.steps if total is None else total
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


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


def _soft_rows(to_row, batch, size: int):
    """The batch's top-k soft labels as rows of the head being trained, or None."""
    if batch.soft_ids is None:
        return None
    k = batch.soft_ids.shape[-1]
    return to_row(batch.soft_ids.reshape(-1, size, k)), batch.soft_logp.reshape(-1, size, k)


def _step_rows(cfg: TrainConfig, store: FeatureStore, groups, step: int, rng: random.Random):
    if cfg.anchors == "all":
        return rows_for_step(groups, step, cfg.seed)
    return rng.sample(range(len(store)), cfg.batch_size)


def _groups(cfg: TrainConfig, store: FeatureStore):
    if cfg.anchors not in ("sampled", "all"):
        raise ValueError(f"anchors must be 'sampled' or 'all', not {cfg.anchors!r}")
    if cfg.anchors == "sampled":
        return None
    counts = [len(t) - max(s - 1, 0) - 1 for t, s in zip(store.tokens, store.starts, strict=True)]
    return length_groups(counts, [len(t) for t in store.tokens], cfg.step_budget)


def train(
    drafter: DFlashDrafter,
    target: TargetModel,
    store: FeatureStore,
    cfg: TrainConfig,
    out_dir: str | Path,
    progress: bool = True,
    heldout: FeatureStore | None = None,
) -> DFlashDrafter:
    """Train (resuming from out_dir/checkpoint.pt if present); logs to out_dir/train_log.jsonl.

    The learning-rate curve ends at the step total of the run's first start (kept in the
    checkpoint): a resumed run with a larger --steps goes on at the final learning rate
    instead of restarting the curve. With `heldout`, every checkpoint logs the greedy
    acceptance on it (heldout.teacher_forced_acceptance) as {"heldout": ...}.
    """
    from tqdm.auto import tqdm

    if cfg.distill > 0 and not store.has_topk:
        raise ValueError("distillation needs features extracted with top-k log-probabilities")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, log_path = out_dir / "checkpoint.pt", out_dir / "train_log.jsonl"
    embed = target.embed_tokens.weight.detach().float()
    to_row = _label_map(drafter)
    most = drafter.config.block_size
    sizes = tuple(cfg.block_sizes or (most,))
    if any(not 2 <= b <= most for b in sizes):
        raise ValueError(f"block sizes {sizes} must be within 2..{most} (the drafter's block)")
    drafter.float().train()
    head = drafter.lm_head.weight if drafter.own_head else target.lm_head.weight.detach()
    frozen_head = head.detach()  # shares the trained head's storage: evaluation sees updates
    opt = torch.optim.AdamW(
        drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95)
    )
    step, g, total = 0, torch.Generator().manual_seed(cfg.seed), cfg.steps
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        g.set_state(state["generator"])
        total = state.get("schedule_steps", total)
    (out_dir / "train_config.json").write_text(
        json.dumps({**asdict(cfg), "schedule_steps": total}, indent=2)
    )
    groups = _groups(cfg, store)
    rng = random.Random(cfg.seed + step)
    bar = tqdm(
        total=cfg.steps, initial=step, desc="train drafter", unit="step", disable=not progress
    )
    window: list[float] = []
    correct, valid = torch.zeros(most), torch.zeros(most)
    started = time.perf_counter()

    def log(record: dict) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    while step < cfg.steps:
        rows = _step_rows(cfg, store, groups, step, rng)
        size = sizes[step % len(sizes)]
        batch = make_batch(
            store,
            rows,
            size,
            drafter.config.mask_token_id,
            embed,
            blocks_per_seq=None if cfg.anchors == "all" else cfg.blocks_per_seq,
            generator=g,
            soft=cfg.distill > 0,
        )
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step, total)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast_bf16):
            ctx = drafter.context_kv(
                drafter.project_context(batch.features), batch.context_positions
            )
            hidden = drafter(batch.embeds, batch.positions, ctx, batch.mask)  # [B, A*S, H]
            loss, c, v = block_loss(
                hidden.reshape(-1, size, hidden.shape[-1]),
                head,
                to_row(batch.labels.reshape(-1, size)),
                position_weights(size, cfg.gamma),
                soft=_soft_rows(to_row, batch, size),
                distill=cfg.distill,
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        window.append(loss.item())
        correct[:size] += c.cpu()
        valid[:size] += v.cpu()
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            acc = (correct / valid.clamp_min(1)).tolist()
            record = {
                "step": step,
                "loss": sum(window) / len(window),
                "lr": _lr(cfg, step - 1, total),
                "acc_per_position": [round(a, 4) for a in acc[1:]],
                "elapsed_s": round(time.perf_counter() - started, 1),
            }
            log(record)
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
                    "schedule_steps": total,
                },
            )
            if heldout is not None:
                held = [
                    {
                        "k": b - 1,
                        **teacher_forced_acceptance(drafter, heldout, embed, frozen_head, b - 1),
                    }
                    for b in sorted(set(sizes))
                ]
                log({"step": step, "heldout": held})
                bar.write(
                    f"step {step}: held-out "
                    + ", ".join(f"k={h['k']}: p1 {h['p1']:.3f} tau {h['tau']:.2f}" for h in held)
                )
    bar.close()
    return drafter.eval()

"""Model card for an exported drafter: data, command, hyperparameters, loss curve, measured tau."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from dflash.train.prompts import chat_prompt_ids, heldout_prompts
from dflash.train.responses import load_responses

__all__ = [
    "card_for_run",
    "card_line",
    "eval_prompt_ids",
    "evaluate_tau",
    "plot_curve",
    "write_card",
]


def evaluate_tau(
    target,
    drafter,
    prompts: list[list[int]],
    stop_id: int,
    num_draft_tokens: int,
    max_new_tokens: int = 128,
) -> dict[str, Any]:
    """Greedy DFlash on held-out prompts through the reference loop: tau and per-position rates."""
    from dflash.generate import generate  # lazy: torch

    taus, accepted, drafted = [], None, 0
    for i in range(0, len(prompts), 8):
        r = generate(
            target,
            prompts[i : i + 8],
            max_new_tokens,
            drafter=drafter,
            num_draft_tokens=num_draft_tokens,
            stop_token_ids=[stop_id],
        )
        taus.extend(r.stats.acceptance_lengths)
        pos = r.stats.position_accepted
        accepted = pos if accepted is None else [a + b for a, b in zip(accepted, pos, strict=True)]
        drafted += r.stats.position_drafted
    return {
        "num_draft_tokens": num_draft_tokens,
        "tau": round(sum(taus) / len(taus), 3),
        "histogram": dict(sorted(Counter(taus).items())),
        "per_position_acceptance": [round(a / max(drafted, 1), 3) for a in accepted or []],
    }


def read_log(log_path: Path) -> tuple[list[dict], list[dict]]:
    """train_log.jsonl -> (training records, held-out acceptance records)."""
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "loss" in r], [r for r in rows if "heldout" in r]


def plot_curve(log_path: Path, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, held = read_log(log_path)
    steps = [r["step"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(steps, [r["loss"] for r in rows])
    ax1.set(xlabel="step", ylabel="weighted CE", title="training loss")
    for k in (0, 3, 7, 14):
        if k < len(rows[0]["acc_per_position"]):
            ax2.plot(steps, [r["acc_per_position"][k] for r in rows], label=f"position {k + 1}")
    if held:
        ax2.plot(
            [r["step"] for r in held],
            [r["heldout"][0]["p1"] for r in held],
            "k--o",
            label=f"position 1, held-out (k={held[-1]['heldout'][0]['k']})",
        )
    ax2.set(xlabel="step", ylabel="accuracy", title="per-position accuracy (train)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def write_card(
    out_dir: Path,
    *,
    command: str,
    config: dict,
    train_config: dict,
    data: dict,
    evals: list[dict],
    step: int,
    log_path: Path,
    lineage: str = "",
) -> None:
    """README.md + loss_curve.png (+ eval.json) beside the weights."""
    plot_curve(log_path, out_dir / "loss_curve.png")
    (out_dir / "eval.json").write_text(json.dumps(evals, indent=2) + "\n")
    trained, held = read_log(log_path)
    last = trained[-1]
    heldout = (
        "Held-out greedy acceptance at the last checkpoint (every anchor of the target's "
        "greedy responses to the held-out prompts, teacher-forced): "
        + "; ".join(
            f"k={h['k']}: position-1 {h['p1']}, tau {h['tau']} over {h['anchors']} anchors"
            for h in held[-1]["heldout"]
        )
        + "."
        if held
        else ""
    )
    rows = "\n".join(
        f"| {e['num_draft_tokens']} | {e['tau']} | {e['per_position_acceptance'][:8]} |"
        for e in evals
    )
    acc = last["acc_per_position"]
    arch = (
        f"{config['num_hidden_layers']} Qwen3-style layers, hidden {config['hidden_size']}, "
        f"block size {config['block_size']}, target features from layers "
        f"{config['dflash_config']['target_layer_ids']} (0-based), mask token id "
        f"{config['dflash_config']['mask_token_id']}."
    )
    head = (
        f"Its own LM head covers the {config['draft_vocab_size']} most frequent response tokens "
        "(`lm_head.weight` + vLLM's `d2t` offset map); embeddings are the target's."
        if config.get("draft_vocab_size")
        else "Embeddings and LM head are the target's (not stored here)."
    )
    (out_dir / "README.md").write_text(f"""# DFlash drafter for SmolLM2-135M-Instruct

A block-diffusion drafter for speculative decoding (DFlash), trained by agentserve for the
bundled target model. Loads in vLLM with
`speculative_config={{"method": "dflash", "model": "<this dir>", "num_speculative_tokens": N}}`
(N <= block size - 1), and in transformers with
`AutoModel.from_pretrained("<this dir>", trust_remote_code=True)` (the `dflash.py` here).

## Architecture
{arch}
{head}

## Data
The target's own greedy responses (vLLM) to: seeded prompts (arithmetic word problems, coding
tasks, chat requests), prompts the model wrote itself, code tasks (complete / fix / explain /
edit / type hints / tests) over real functions from installed third-party packages, and
agent-style prompts (tool output to summarise as JSON, multi-turn exchanges quoting tool
results, tool calls from real schemas). Never used: HumanEval, the Python standard library's
source or docstrings (and copies vendored in packages), and the held-out packages that the
benchmark's agent/code prompts are built from.
{json.dumps(data)}

## Training
Command: `{command}`

{lineage}

Hyperparameters: {json.dumps(train_config)}

Trained {step} steps; final weighted CE {last["loss"]:.3f}; train accuracy at block
positions 1 / 4 / last: {acc[0]} / {acc[min(3, len(acc) - 1)]} / {acc[-1]}.
{heldout}

![loss curve](loss_curve.png)

## Measured acceptance (held-out prompts, greedy, dflash reference loop)
| drafted tokens | tau (tokens per step) | per-position acceptance (first 8) |
|---|---|---|
{rows}
""")


def card_line(directory: Path) -> str:
    """'Trained N steps; final weighted CE X' from a drafter's model card (its history)."""
    card = directory / "README.md"
    lines = card.read_text().splitlines() if card.exists() else []
    line = next((line.strip() for line in lines if line.startswith("Trained ")), "no card")
    return "; ".join(line.split("; ")[:2])


def _lineage(work: Path) -> str:
    path = work / "train" / "warm_start.txt"
    return f"Warm start: {path.read_text().strip()}." if path.exists() else ""


def eval_prompt_ids(tokenizer, count: int) -> list[list[int]]:
    """Token ids of `count` held-out prompts: half HumanEval, half held-out math."""
    held = heldout_prompts()
    half = count // 2
    picked = [p for p in held if p.source == "humaneval"][: count - half] + [
        p for p in held if p.source == "math-heldout"
    ][:half]
    return [chat_prompt_ids(tokenizer, p.text) for p in picked]


def card_for_run(
    out: Path,
    work: Path,
    target,
    drafter,
    tokenizer,
    step: int,
    *,
    eval_prompts: int = 32,
    stages: tuple[str, ...] = ("data", "features", "train", "export"),
    features: Path | None = None,
) -> None:
    """Evaluate tau on held-out prompts and write README.md, loss_curve.png, eval.json."""
    from dflash.train.features import FeatureStore  # lazy: torch

    prompts = eval_prompt_ids(tokenizer, eval_prompts)
    most = drafter.config.block_size - 1
    evals = [
        evaluate_tau(target, drafter, prompts, tokenizer.eos_token_id, k)
        for k in sorted({min(3, most), min(7, most)})  # DFlash on a CPU; on a GPU
    ]
    records = load_responses(work / "responses.jsonl")
    store = FeatureStore(features or work / "features")
    data = {
        "responses": len(records),
        "trained_on_sequences": len(store),
        "trained_on_tokens": store.num_tokens,
        "by_source": dict(Counter(r["source"] for r in records)),
        "response_tokens": sum(len(r["response_ids"]) for r in records),
        "heldout_eval_prompts": len(prompts),
    }
    commands = [
        (work / f"{s}.command").read_text().strip()
        for s in stages
        if (work / f"{s}.command").exists()
    ]
    write_card(
        out,
        command=" && ".join(dict.fromkeys(commands)) or "agentserve train-drafter",
        config=drafter.config.to_hf_dict(),
        train_config=json.loads((work / "train" / "train_config.json").read_text()),
        data=data,
        evals=evals,
        step=step,
        log_path=work / "train" / "train_log.jsonl",
        lineage=_lineage(work),
    )

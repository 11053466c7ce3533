"""Drafter training, data stage: prompts, then the target's responses via vLLM.

The prompts are seeded training prompts, code-context and agent prompts over third-party
packages (never the stdlib or HumanEval), and prompts the model writes itself; a fresh work
dir starts from the committed responses archive and generation continues where it ends.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import dflash.train as dflash_train
from dflash.train.code_prompts import (
    TRAINING_PACKAGES,
    StdlibIndex,
    agent_prompts,
    code_prompts,
    collect_snippets,
)
from dflash.train.prompts import TOPICS, Prompt, check_disjoint, heldout_prompts, training_prompts
from dflash.train.responses import (
    generate_responses,
    load_responses,
    self_written_prompts,
    start_engine,
)

__all__ = ["DATA_MAX_MODEL_LEN", "responses_archive", "restore_responses", "stage_data"]


def stage_data(args: argparse.Namespace, model_dir: Path, work: Path) -> None:
    responses = work / "responses.jsonl"
    prompts = training_prompts(args.num_prompts, seed=args.seed)
    prompts += _context_prompts(args, work / "context_prompts.jsonl")
    self_path = work / "self_prompts.jsonl"
    total = len(prompts) + args.self_written
    if len(load_responses(responses)) >= total:
        print(f"data: {responses} complete")
        return
    llm = start_engine(
        str(model_dir), max_model_len=DATA_MAX_MODEL_LEN, max_num_seqs=64, seed=args.seed
    )
    if args.self_written and not self_path.exists():
        own = self_written_prompts(llm, TOPICS, args.self_written, seed=args.seed)
        _save_prompts(own, self_path)
    prompts += _load_prompts(self_path)
    check_disjoint(prompts, heldout_prompts())
    generate_responses(
        llm,
        _interleaved(prompts),
        responses,
        max_tokens=args.max_tokens,
        sampled_fraction=args.sampled_fraction,
        seed=args.seed,
        max_prompt_tokens=DATA_MAX_MODEL_LEN - args.max_tokens,
    )


def responses_archive(model: str) -> Path:
    """Where a model's generated training responses are committed (the bundled model's: hours
    of CPU work): a fresh work dir starts from them and the data stage continues where they
    end."""
    return Path(dflash_train.__file__).parent / "data" / f"{model}-responses.jsonl.gz"


def restore_responses(archive: Path | None, work: Path) -> None:
    """Start `work`'s responses from `archive` unless it holds some already (or none given)."""
    import gzip
    import shutil

    target = work / "responses.jsonl"
    if target.exists() or archive is None or not archive.exists():
        return
    with gzip.open(archive, "rb") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    print(f"data: restored {target} from {archive.name}")


def _interleaved(prompts: list) -> list:
    """Round-robin over prompt kinds (seeded, code tasks, agent prompts, ...), so a data
    job stopped early still holds every kind; the order within a kind is kept."""
    from itertools import zip_longest

    kinds: dict[str, list] = {}
    for p in prompts:
        kinds.setdefault(p.source.split("-")[0], []).append(p)
    return [p for group in zip_longest(*kinds.values()) for p in group if p is not None]


DATA_MAX_MODEL_LEN = 1536
"""Context of the data engine; longer prompts (prompt + max_tokens past it) are skipped."""


def _save_prompts(prompts: list, path: Path) -> None:
    path.write_text("".join(json.dumps(p.__dict__) + "\n" for p in prompts))


def _load_prompts(path: Path) -> list:
    if not path.exists():
        return []
    return [Prompt(**json.loads(line)) for line in path.read_text().splitlines()]


def _context_prompts(args: argparse.Namespace, path: Path) -> list:
    """Code-context and agent prompts, built once and kept in the work dir (they depend on
    the installed packages, so a resumed job must reuse the same list). Asking for more
    than the file holds rebuilds it: the builders are prefix-stable for a seed, so the kept
    prompts stay first with their ids and only the new ones are generated."""
    kept = _load_prompts(path)
    wanted = {"code": args.code_prompts, "agent": args.agent_prompts}
    held = {kind: sum(p.id.startswith(kind) for p in kept) for kind in wanted}
    if any(held[k] < n for k, n in wanted.items()):
        print("data: indexing the standard library (excluded) and third-party code", flush=True)
        snippets = collect_snippets(TRAINING_PACKAGES, StdlibIndex(), seed=args.seed)
        built = code_prompts(snippets, max(args.code_prompts, held["code"]), seed=args.seed)
        built += agent_prompts(snippets, max(args.agent_prompts, held["agent"]), seed=args.seed)
        _check_prefix(kept, built)
        _save_prompts(built, path)
        print(f"data: {len(built)} prompts from {len(snippets)} functions -> {path}", flush=True)
        kept = built
    return kept


def _check_prefix(kept: list, built: list) -> None:
    """Refuse a rebuilt list that changes a kept prompt: its id may already have a
    response, which would then be paired with the wrong prompt's kind and text."""
    ids = {p.id: p for p in built}
    changed = [p.id for p in kept if ids.get(p.id) != p]
    if changed:
        raise SystemExit(
            f"data: {len(changed)} kept context prompts differ when rebuilt (first: "
            f"{changed[0]}); the installed packages changed since this work dir was made. "
            "Use a new --work-dir, or keep the counts the file already holds."
        )

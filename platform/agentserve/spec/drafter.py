"""DrafterSpec: one model's speculative decoding (vLLM speculative_config) and the rules of its
drafted-tokens-by-batch-size schedule."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from agentserve.sources.models import is_hub_id, is_local_path
from agentserve.spec.base import _revision_field, _Spec

DRAFTERLESS_METHODS = ("ngram", "suffix", "mtp")
"""Speculative methods that draft without a separate drafter model."""

DFLASH_METHODS = ("dflash", "hybrid")
"""Methods whose engine runs a DFlash drafter on every step (hybrid: under its n-gram
drafts too, since the drafter must see every accepted token)."""


class DrafterSpec(_Spec):
    """Speculative decoding drafter for one model (vLLM speculative_config)."""

    enabled: bool = Field(
        False,
        description="Speculate with the drafter. Unset on the bundled model: the method "
        "measured fastest through the server on the kind of machine the replicas run on "
        "(agentserve up: this machine, calibrated where unmeasured; Kubernetes: GPU replicas "
        "as 'cuda', CPU replicas of unknown kind), plain decoding where none is measured. "
        "Unset on GPU replicas of a model the drafter catalog lists (agentserve/drafters/"
        "catalog.json, e.g. Qwen/Qwen3-8B): its published DFlash drafter (path unset, "
        "method dflash, num_speculative_tokens block_size - 1 where unset); other models "
        "decode plainly.",
    )
    path: str | None = Field(
        None,
        description="Drafter: a Hugging Face id (e.g. z-lab/Qwen3-8B-DFlash-b16, downloaded "
        "once into the hub cache before the engine starts) or a local directory (absolute "
        "or ./relative); null = the drafter shipped for the bundled model.",
    )
    revision: str | None = _revision_field("path")
    method: Literal["dflash", "ngram", "hybrid", "suffix", "eagle3", "mtp"] = Field(
        "dflash",
        description="vLLM speculative method: dflash (block-diffusion drafter; `path`, or the "
        "shipped one for the bundled model), ngram (prompt lookup, no drafter), hybrid "
        "(n-gram drafts where prompt lookup finds a match, else the DFlash drafter's first "
        "`dflash_tokens`; the drafter runs every step), suffix "
        "(suffix decoding, needs the arctic-inference package), eagle3 (an EAGLE-3 drafter "
        "at `path`), mtp (the model's own multi-token-prediction layers).",
    )
    num_speculative_tokens: int = Field(
        7,
        ge=1,
        le=64,
        description="Tokens drafted per step. Left unset with a local DFlash drafter (dflash, "
        "hybrid) whose block holds fewer, block_size - 1; a value set is checked against "
        "the block.",
    )
    min_acceptance_length: float = Field(
        1.2,
        ge=1.0,
        description="Alert floor on the mean tokens per verify step (tau): the "
        "AgentserveAcceptanceCollapsed alert fires when the drafter stays below it "
        "(exported as agentserve_spec_decode_acceptance_floor); 1.0 = never.",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, description="ngram: shortest suffix of the text matched in the prompt."
    )
    prompt_lookup_max: int = Field(
        4, ge=1, description="ngram: longest suffix of the text matched in the prompt."
    )
    dflash_tokens: int = Field(
        3,
        ge=1,
        le=64,
        description="hybrid: tokens drafted by DFlash where prompt lookup finds no match "
        "(at most num_speculative_tokens, which n-gram drafts use).",
    )
    dflash_max_batch: int | None = Field(
        1,
        ge=1,
        description="hybrid: the largest batch (requests in a step) at which DFlash drafts "
        "where prompt lookup finds no match; in bigger batches only n-gram drafts and the "
        "drafter only keeps its context (it must see every token), which spares its block "
        "forward over every row. null = every batch. Measured through the server with 1: "
        "hybrid at 4 streams 0.86-0.89x n-gram alone, against 0.79-0.83x drafting with "
        "DFlash there (docs/benchmarks.md); at 1 stream unchanged.",
    )
    num_speculative_tokens_per_batch_size: (
        list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=3, max_length=3)]] | None
    ) = Field(
        None,
        min_length=1,
        description="Drafted tokens by batch size: [[start, end, k], ...], inclusive ranges "
        "sorted from batch 1, non-overlapping, 0 <= k <= num_speculative_tokens (0 = no "
        "drafting); gaps and batches past the last range keep the previous k. null = always "
        "num_speculative_tokens, unless `speculation_schedule` is auto. `agentserve spec "
        "speculation-schedule` prints the schedule the latency model chooses.",
    )
    speculation_schedule: Literal["auto", "off"] = Field(
        "auto",
        description="auto: when num_speculative_tokens_per_batch_size is null and agentserve "
        "has a latency model for this model (today: the bundled model under vLLM on CPU), "
        "fill it from that model before serving, so drafting shrinks as the batch grows and "
        "a saturated replica gives back the compute speculation costs; off: always draft "
        "num_speculative_tokens. An explicit num_speculative_tokens_per_batch_size is used "
        "either way.",
    )

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: str | None) -> str | None:
        if path is None or is_local_path(path) or is_hub_id(path):
            return path
        raise ValueError(
            f"{path!r} is neither a Hugging Face id (ORG/NAME) nor a local directory (an "
            "absolute path or one starting with ./)"
        )

    @model_validator(mode="after")
    def _check_schedule(self) -> DrafterSpec:
        if self.revision is not None and (self.path is None or not is_hub_id(self.path)):
            raise ValueError("drafter.revision: only a Hugging Face id `path` has revisions")
        if self.path is not None and self.method in DRAFTERLESS_METHODS:
            raise ValueError(f"drafter.path: method {self.method!r} uses no drafter model")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"drafter.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        if self.method == "hybrid" and self.dflash_tokens > self.num_speculative_tokens:
            raise ValueError(
                f"drafter.dflash_tokens ({self.dflash_tokens}) must be <= "
                f"num_speculative_tokens ({self.num_speculative_tokens}): one engine k "
                "bounds both proposers"
            )
        if self.num_speculative_tokens_per_batch_size is not None:
            check_speculation_schedule(
                self.num_speculative_tokens_per_batch_size, self.num_speculative_tokens
            )
        return self


def tokens_for_block(tokens: int, set_by_spec: bool, block_tokens: int) -> int:
    """The tokens to draft with a DFlash drafter whose block holds `block_tokens`
    (block_size - 1): `tokens` as the spec sets it (the engine's arguments check it against
    the block), or, left unset, at most what the block holds (a drafter trained for a
    CPU's small blocks serves instead of being refused for the default k)."""
    return tokens if set_by_spec else min(tokens, block_tokens)


def check_speculation_schedule(schedule: list[list[int]], num_speculative_tokens: int) -> None:
    """Raise ValueError unless `schedule` satisfies vLLM 0.32's rules for
    num_speculative_tokens_per_batch_size (vllm/v1/spec_decode/dynamic/utils.py): entries
    (start, end, k) with 1 <= start <= end, ranges sorted and non-overlapping, the first
    starting at 1, k >= 0. Stricter than vLLM: it sorts and clamps k, we require sorted
    ranges and k <= num_speculative_tokens."""
    previous_end = 0
    for i, (start, end, k) in enumerate(schedule):
        where = f"num_speculative_tokens_per_batch_size[{i}] {[start, end, k]}"
        if i == 0 and start != 1:
            raise ValueError(f"{where}: the first range must start at batch size 1")
        if not 1 <= start <= end:
            raise ValueError(f"{where}: needs 1 <= start <= end")
        if start <= previous_end:
            raise ValueError(f"{where}: ranges must be sorted and must not overlap")
        if k > num_speculative_tokens:
            raise ValueError(
                f"{where}: k must be <= num_speculative_tokens ({num_speculative_tokens})"
            )
        previous_end = end

"""LatencyModelSpec: a model's measured step costs, for the SLA policy's capacity model.

The SLA policy plans replicas (its capacity floor, burst detection and the TPOT it expects
at a batch size) from a LatencyModel (autoscale/model.py). The platform carries one for the
bundled model on CPU; for any other model, or on GPU, it has none and the policy scales
reactively only, from the latencies it observes. `agentserve bench fit-latency` measures a
running server (plain decoding at several concurrencies, prefill from two prompt lengths)
and prints this section.
"""

from __future__ import annotations

from pydantic import Field

from agentserve.spec.base import _Spec

__all__ = ["LatencyModelSpec"]


class LatencyModelSpec(_Spec):
    """One decode step of a batch verifying `tokens` tokens takes
    base_ms + per_token_ms x max(0, tokens - knee_tokens); a prompt token adds
    prefill_ms_per_token to the step it is prefilled in."""

    base_ms: float = Field(gt=0, description="A decode step of one sequence, ms.")
    per_token_ms: float = Field(
        ge=0, description="What each token in the step beyond knee_tokens adds, ms."
    )
    knee_tokens: float = Field(
        4.0, ge=0, description="Tokens a step carries at base_ms before it slows."
    )
    prefill_ms_per_token: float = Field(ge=0, description="Prefill cost per prompt token, ms.")
    alpha_1: float | None = Field(
        None,
        ge=0,
        le=0.99,
        description="Speculation: per-token acceptance at batch 1; null = the drafter "
        "method's measured one for the bundled model, else none assumed (planned as if no "
        "draft were accepted, and the drafter keeps its fixed num_speculative_tokens).",
    )
    alpha_drop_per_doubling: float | None = Field(
        None, ge=0, le=1, description="How much acceptance falls per doubling of the batch."
    )
    speculative_step_factor: float = Field(
        1.0, ge=1, description="What a speculative step costs beyond its roofline (drafting)."
    )

"""Admission to a model's queue: capacity, each tenant's fair share of it, the token
reservation a request makes against its tenant's tokens_per_minute, and an admitted
request's bookkeeping (AdmittedCall).

Fair share (with two or more tenants): each tenant is guaranteed
`max(1, server.max_queue_len // tenants)` requests per model. A tenant without its own
`max_concurrent_requests` may go beyond its guarantee only while the model keeps room for
every other tenant's unused guarantee; otherwise it gets 429 (code fair_share_exceeded).
A lone busy tenant still fills every engine slot (max_num_seqs x max_replicas) and its
share of the queue, and another tenant arriving is always admitted up to its guarantee.
A tenant with its own max_concurrent_requests is bounded by that instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentserve.admission.quota import Lease
from agentserve.api.ask import Ask
from agentserve.api.auth import Tenant
from agentserve.api.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    RateLimitError,
)
from agentserve.engine.delta_tracker import DeltaTracker
from agentserve.spec import DeploymentSpec, ModelSpec

__all__ = ["AdmittedCall", "QueueShares", "estimate_prompt_tokens", "model_capacity"]
__all__ += ["prompt_estimates", "prompt_tokens", "token_reservation"]

CHARS_PER_TOKEN = 4  # typical for English BPE vocabularies; settled to the real count


def model_capacity(model: ModelSpec, max_queue_len: int) -> int:
    """Requests the ingress admits for `model` (running plus queued) before answering
    503: every engine slot at max_replicas (max_num_seqs each) plus the queue. The one
    definition: admission, the capacity gauge the alerts read, and the ingress
    deployment's own max_ongoing_requests (serve/app.py) all use it."""
    return model.engine_slots * model.replicas.max_replicas + max_queue_len


def ingress_replicas(spec: DeploymentSpec) -> int:
    """Ingress replicas of `spec`: server.ingress_replicas, 1 when unset (the operator sets
    it for a cluster)."""
    return spec.server.ingress_replicas or 1


@dataclass
class AdmittedCall(DeltaTracker):
    """One admitted request's bookkeeping: its stream so far (DeltaTracker, fed each delta
    with the ingress clock), its lease and places; given back once (serve/stages.py)."""

    model: str
    tenant: str
    start: float
    lease: Lease
    count: int = 1  # places it holds in the model's queue: its choices (n)
    adapter: str | None = None  # the LoRA adapter the request named (admission/adapter_names.py)


class QueueShares:
    """Requests in flight per model and per (model, tenant); admit() or refuse."""

    def __init__(self, capacity: Mapping[str, int], queue_len: int):
        self.capacity = dict(capacity)
        self.queue_len = queue_len
        self.in_flight = dict.fromkeys(self.capacity, 0)
        self._mine: dict[str, dict[str, int]] = {m: {} for m in self.capacity}
        self._tenants: list[Tenant] = []

    def set_tenants(self, tenants: Sequence[Tenant]) -> None:
        """The tenants sharing the models (a key or quota rotation may change them)."""
        self._tenants = list(tenants)

    def guarantee(self, tenant: Tenant) -> int:
        """Requests per model `tenant` is always admitted up to (while the model has room)."""
        g = max(1, self.queue_len // max(1, len(self._tenants)))
        own = tenant.rate_limit.max_concurrent_requests
        return min(g, own) if own else g

    def admit(self, model: str, tenant: Tenant, count: int = 1) -> None:
        """Count one request of `count` choices (each an engine sequence) as `count`
        places; ModelNotFoundError (404), InvalidRequestError (400, more choices than the
        model ever admits at once for the tenant), OverloadedError (503, the model is full)
        or RateLimitError (429, the tenant is past its fair share)."""
        if model not in self.in_flight:
            raise ModelNotFoundError(model, sorted(self.in_flight))
        total, capacity = self.in_flight[model], self.capacity[model]
        most = self._most_ever(capacity, tenant)
        if count > most:  # not even on an idle model: retrying cannot help
            raise InvalidRequestError(
                f"this request's {count} choices (n, times a batch's prompts) are more than "
                f"model {model!r} ever queues at once for tenant {tenant.name!r} ({most}); "
                "send fewer prompts or a smaller n",
                param="n",
                code="too_many_choices",
            )
        if total + count > capacity:
            raise OverloadedError(
                f"model {model!r} has {total} requests queued or running; retry later"
            )
        mine = self._mine[model].get(tenant.name, 0)
        if self._shared(tenant) and mine + count > self.guarantee(tenant):
            held = sum(
                max(0, self.guarantee(u) - self._mine[model].get(u.name, 0))
                for u in self._tenants
                if u.name != tenant.name
            )
            if total + count + held > capacity:
                raise RateLimitError(
                    f"tenant {tenant.name!r} has {mine} requests queued or running on model "
                    f"{model!r}, its fair share while other tenants may need the rest; "
                    "retry later",
                    code="fair_share_exceeded",
                )
        self.in_flight[model] = total + count
        self._mine[model][tenant.name] = mine + count

    def release(self, model: str, tenant: str, count: int = 1) -> None:
        self.in_flight[model] -= count
        left = self._mine[model].get(tenant, 0) - count
        if left > 0:
            self._mine[model][tenant] = left
        else:
            self._mine[model].pop(tenant, None)

    def _most_ever(self, capacity: int, tenant: Tenant) -> int:
        """The most choices one request of `tenant` is admitted with on an idle model: the
        capacity, less the other tenants' guarantees when it is past its own."""
        if not self._shared(tenant):
            return capacity
        others = sum(self.guarantee(u) for u in self._tenants if u.name != tenant.name)
        return max(self.guarantee(tenant), capacity - others)

    def _shared(self, tenant: Tenant) -> bool:
        return len(self._tenants) > 1 and not tenant.rate_limit.max_concurrent_requests


def estimate_prompt_tokens(ask: Ask) -> int:
    """A cheap estimate of the prompt's tokens (the ingress has no tokenizer), summed over
    a batch's prompts (prompt_estimates)."""
    return sum(prompt_estimates(ask))


def prompt_estimates(ask: Ask) -> list[int]:
    """Each prompt's estimated tokens (one for a chat request; a completion batch's, in
    order, api/prompts.py): token-id prompts exactly; text as max(characters /
    CHARS_PER_TOKEN, words), plus tools (an admission view's `tools_chars`, its body's size
    less the message text counted; else the tools' text)."""
    if ask.prompts is not None:
        return [prompt_tokens(p) for p in ask.prompts or [""]]
    return [_chat_tokens(ask)]


def _chat_tokens(ask: Ask) -> int:
    total = counted = 0
    for message in ask.messages:
        content = message.get("content") if isinstance(message, dict) else None
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else part
            total += 1 + (_text_tokens(text) if isinstance(text, str) else 0)
            counted += len(text) if isinstance(text, str) else 0
    if ask.tools_chars is not None:  # the body's size holds the messages counted above too
        return total + math.ceil(max(0, ask.tools_chars - counted) / CHARS_PER_TOKEN)
    for tool in ask.tools:
        total += _text_tokens(str(tool.model_dump() if hasattr(tool, "model_dump") else tool))
    return total


def prompt_tokens(prompt: Any) -> int:
    """A single completion prompt's tokens; 0 for a value validation will refuse (an
    admission view is read before validation)."""
    if isinstance(prompt, list):
        return len(prompt)
    return _text_tokens(prompt) if isinstance(prompt, str) else 0


def _text_tokens(text: str) -> int:
    words = text.count(" ") + text.count("\n") + 1 if text else 0
    return max(math.ceil(len(text) / CHARS_PER_TOKEN), words)


def token_reservation(ask: Ask, context: int | None) -> int:
    """Tokens to reserve at admission: prompt estimate + the output limit (without one,
    the rest of the context), at most the context, with the output counted once per choice
    (n); the prompt counts once, as in usage; a completion batch reserves the sum over its
    prompts."""
    limit, total = ask.output_limit, 0
    for prompt in prompt_estimates(ask):  # a batch: each prompt with its n choices
        out = max(1, (context or prompt + 1) - prompt) if limit is None else limit
        one = min(prompt + out, context) if context else prompt + out
        total += one + (ask.n - 1) * max(0, one - prompt)
    return total

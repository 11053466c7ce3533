"""Parse and admit in the cheaper order: a request whose validation is expensive (tool or
response_format schemas, or a large body) is admitted first, from a few fields of its
decoded body, and validated only once admitted; a plain small one is validated first,
as before (its parse is cheap, and errors then name the field before any limit).

So a tenant past its limits or fair share gets its 429 before any schema is checked, and
the schemas of requests that are admitted are checked on the tenant's own turns
(serve/parsing.py). The admission view carries exactly the fields token_reservation and
the queue count read; when one of them has the wrong type, the request is validated
first and the 400 names it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from agentserve.admission.shares import AdmittedCall, token_reservation
from agentserve.api.auth import Tenant
from agentserve.api.prompts import (
    MAX_BATCH_CHOICES,
    MAX_PROMPTS,
    choice_count,
    split_prompts,
)
from agentserve.api.validate import MAX_CHOICES
from agentserve.engine.protocol import RequestKind
from agentserve.serve.parsing import INLINE_BODY_BYTES, RequestParser

__all__ = ["Admission", "admission_view", "parse_and_admit"]

# (model, tenant, tokens to reserve, places) -> the admitted call; 404/429/503 as APIError
Admission = Callable[[str, Tenant, int, int], Awaitable[AdmittedCall]]


async def parse_and_admit(
    parser: RequestParser,
    admit: Admission,
    kind: RequestKind,
    raw: bytes,
    translate: Callable[[Any], Any] | None,
    tenant: Tenant,
) -> Any:
    """The validated request, admitted through `admit`: 400/404/429/503 as APIError. A
    request admitted before its check may then fail it: the caller holds what `admit`
    took (serve/stages.py gives it back)."""
    large = len(raw) > INLINE_BODY_BYTES
    data = await parser.decode(raw, translate, tenant.name)
    view = admission_view(kind, data, len(raw)) if (large or parser.heavy(data)) else None
    if view is None:
        body = await parser.validate(kind, data, tenant.name, large=large)
        await _admit(parser, admit, kind, body, tenant)
        return body
    await _admit(parser, admit, kind, view, tenant)
    return await parser.validate(kind, data, tenant.name, large=large)


async def _admit(
    parser: RequestParser, admit: Admission, kind: RequestKind, body: Any, tenant: Tenant
) -> AdmittedCall:
    reserve = token_reservation(kind, body, parser.max_model_len.get(body.model))
    return await admit(body.model, tenant, reserve, choice_count(kind, body))  # prompts x n


def admission_view(kind: RequestKind, data: Any, body_bytes: int = 0) -> SimpleNamespace | None:
    """The fields admission reads, from a decoded body; None when any has a type the
    validation will refuse (then it runs first and names the field). The tools' size for
    the token estimate is the body's (`body_bytes`): serializing 128 tool schemas again
    on the event loop would cost milliseconds."""
    if not isinstance(data, dict):
        return None
    model, n = data.get("model"), data.get("n")
    if not isinstance(model, str) or not model:
        return None
    if n is not None and not (_int(n) and 1 <= n <= MAX_CHOICES):
        return None
    limits = {k: data.get(k) for k in ("max_tokens", "max_completion_tokens")}
    if not all(v is None or (_int(v) and v >= 1) for v in limits.values()):
        return None
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        return None
    fields: dict[str, Any] = {"model": model, "n": n, "tools": tools, **limits}
    if tools:
        fields["tools_chars"] = body_bytes
    if kind == "chat":
        if not isinstance(data.get("messages"), list):
            return None
        fields["messages"] = data["messages"]
    else:
        prompt = data.get("prompt")
        if not isinstance(prompt, (str, list)):
            return None
        batch = len(split_prompts(prompt))
        if batch > MAX_PROMPTS or batch * (n or 1) > MAX_BATCH_CHOICES:
            return None  # validation's 400, not a place in the queue it will never use
        fields["prompt"] = prompt
    return SimpleNamespace(**fields)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

"""Parse and admit in the cheaper order: a request whose validation is expensive (tool or
response_format schemas, or a large body) is admitted first, from a few fields of its
decoded body, and validated only once admitted; a plain small one is validated first,
as before (its parse is cheap, and errors then name the field before any limit).

So a tenant past its limits or fair share gets its 429 before any schema is checked, and
the schemas of requests that are admitted are checked on the tenant's own turns
(admission/parsing.py). The admission view (api/ask.py ask_of_data) carries exactly the
fields token_reservation and the queue count read; when one of them has the wrong type,
the request is validated first and the 400 names it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agentserve.admission.parsing import INLINE_BODY_BYTES, RequestParser
from agentserve.admission.shares import AdmittedCall, token_reservation
from agentserve.api.ask import Ask, ask_of, ask_of_data
from agentserve.api.auth import Tenant
from agentserve.engine.protocol import RequestKind

__all__ = ["Admission", "parse_and_admit"]

# (model, tenant, tokens to reserve, places) -> the admitted call; 404/429/503 as APIError
Admission = Callable[[str, Tenant, int, int], Awaitable[AdmittedCall]]


async def parse_and_admit(
    parser: RequestParser,
    admit: Admission,
    kind: RequestKind,
    raw: bytes,
    translate: Callable[[Any], Any] | None,
    tenant: Tenant,
) -> Ask:
    """The validated request's Ask (api/ask.py), admitted through `admit`:
    400/404/429/503 as APIError. A request admitted before its check may then fail it: the
    caller holds what `admit` took (serve/stages.py gives it back)."""
    large = len(raw) > INLINE_BODY_BYTES
    data = await parser.decode(raw, translate, tenant.name)
    view = ask_of_data(kind, data, len(raw)) if (large or parser.heavy(data)) else None
    if view is None:
        ask = ask_of(kind, await parser.validate(kind, data, tenant.name, large=large))
        await _admit(parser, admit, ask, tenant)
        return ask
    await _admit(parser, admit, view, tenant)
    return ask_of(kind, await parser.validate(kind, data, tenant.name, large=large))


async def _admit(parser: RequestParser, admit: Admission, ask: Ask, tenant: Tenant) -> AdmittedCall:
    reserve = token_reservation(ask, parser.max_model_len.get(ask.model))
    return await admit(ask.model, tenant, reserve, ask.choices)  # prompts x n

"""Per-task context the SDK reads on every model call: the conversation id (session).

`conversation(id)` sets it for the code inside (asyncio tasks started inside inherit it).
Without it, the id comes from the OpenAI Agents SDK's current trace `group_id`, then from
OTel baggage `gen_ai.conversation.id` (what Pydantic AI's `run(conversation_id=...)` sets).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from opentelemetry import baggage

__all__ = ["conversation", "current_conversation_id"]

_CONVERSATION: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentserve_conversation_id", default=None
)
BAGGAGE_KEY = "gen_ai.conversation.id"


@contextlib.contextmanager
def conversation(conversation_id: str) -> Iterator[str]:
    """Run the body as conversation `conversation_id`: every model call inside sends it as
    `x-session-id` (replica affinity keeps its KV cache warm) and spans record it."""
    if not conversation_id:
        raise ValueError("conversation_id must be a non-empty string")
    token = _CONVERSATION.set(conversation_id)
    try:
        yield conversation_id
    finally:
        _CONVERSATION.reset(token)


def _agents_group_id() -> str | None:
    try:
        from agents.tracing import get_current_trace
    except ImportError:
        return None
    current = get_current_trace()
    group = getattr(current, "group_id", None) if current is not None else None
    return group if isinstance(group, str) and group else None


def current_conversation_id() -> str | None:
    """The conversation id in effect here, or None (see the module docstring for the order)."""
    explicit = _CONVERSATION.get()
    if explicit:
        return explicit
    group = _agents_group_id()
    if group:
        return group
    value = baggage.get_baggage(BAGGAGE_KEY)
    return str(value) if value else None

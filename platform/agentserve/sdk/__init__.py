"""agentserve.sdk: run agents written with the OpenAI Agents SDK or Pydantic AI on agentserve.

Two lines in an existing agent program::

    import agentserve.sdk
    agentserve.sdk.connect()   # base URL, key, model: arguments or AGENTSERVE_* variables

Every model call then goes to agentserve with the tenant key, carries the W3C
`traceparent` of its `chat {model}` span and the conversation id as `x-session-id`, and
agents, tools, sub-agents and handoffs are OTel GenAI spans (`invoke_agent {name}`,
`execute_tool {name}`, `chat {model}`) in the same trace as the server's spans.
"""

from agentserve.sdk.connect import Connection, connect
from agentserve.sdk.context import conversation

__all__ = ["Connection", "connect", "conversation"]

"""The OpenAI Responses API (`POST /v1/responses`) on top of the chat-completion path.

A Responses request is translated into the chat-completion body the engines already
serve (validated afterwards by api/openai.parse_request, so every chat bound applies),
and the engine's deltas are rendered back as a Response object or its stream events
(api/responses_render.py). The server is stateless: `previous_response_id`,
`conversation`, `background` and stored prompts are refused, as are built-in tools
(web search, file search, computer use, ...) and image or file inputs, each with a 400
naming the parameter. `store` is accepted and has no effect (nothing is stored).

Input items map to chat messages: a string is one user message; message items keep
their role (developer becomes system, the role chat templates know); function_call
items become the assistant's tool_calls (consecutive ones, and the assistant message
before them, merge into one assistant turn) and function_call_output items tool
messages; reasoning items from an earlier turn are dropped, as chat templates drop them.
"""

from __future__ import annotations

import re
from typing import Any

from agentserve.api.errors import APIError, InvalidRequestError
from agentserve.api.validate import check_values
from agentserve.engine.protocol import EngineRequestError

__all__ = ["ResponsesRequest"]

# Responses parameter -> chat parameter, copied as is
_SAME = ("model", "temperature", "top_p", "parallel_tool_calls", "stream", "user")
# accepted and echoed in the Response, no effect on generation
_ECHOED = (
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "max_tool_calls",
    "stream_options",
)
_TRANSLATED = (
    "input",
    "instructions",
    "max_output_tokens",
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "include",
    "truncation",
)
# parameter -> why it is refused when set (not None / False)
_STATEFUL = "this server is stateless and keeps no responses or conversations"
_REFUSED = {
    "previous_response_id": f"{_STATEFUL}; send the whole conversation in 'input'",
    "conversation": f"{_STATEFUL}; send the whole conversation in 'input'",
    "background": "background responses need stored state; this server is stateless",
    "prompt": "stored prompt templates are not available on this server",
    "top_logprobs": "log probabilities are not returned on /v1/responses",
    "context_management": "server-side context management is not available",
}
_KNOWN = frozenset(_SAME + _ECHOED + _TRANSLATED + tuple(_REFUSED))
# chat names in a validation error -> the Responses names they came from
_RENAMED = (
    (re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens"),
    (re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"\bresponse_format(\.json_schema)?\b"), "text.format"),
    (re.compile(r"^messages\b.*"), "input"),  # messages[i] need not be input[i]
)
_TEXT_PARTS = ("input_text", "output_text", "text")
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _bad(message: str, param: str | None, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def _unsupported(param: str, why: str) -> InvalidRequestError:
    return _bad(f"'{param}' is not supported: {why}.", param, "unsupported_parameter")


class ResponsesRequest:
    """One /v1/responses request: `translate` (its decoded body -> a chat body) remembers
    the fields the Response echoes (`echo`); used once, from one thread at a time."""

    def __init__(self) -> None:
        self.echo: dict[str, Any] = {}

    def translate(self, data: Any) -> dict[str, Any]:
        """The chat-completion body for a Responses body; InvalidRequestError (400)."""
        if not isinstance(data, dict):
            raise _bad("The request body must be a JSON object.", None)
        for name in data:
            if name not in _KNOWN:
                raise _bad(f"Unknown parameter: '{name}'.", name, "unknown_parameter")
        for name, why in _REFUSED.items():
            if data.get(name) not in (None, False):
                raise _unsupported(name, why)
        check_values(data)  # NaN, lone surrogates, depth: also in fields only echoed
        _check_echoed(data)
        _check_truncation(data.get("truncation"))
        _check_include(data.get("include"))
        chat: dict[str, Any] = {k: data[k] for k in _SAME if data.get(k) is not None}
        chat["messages"] = _messages(data.get("instructions"), data.get("input"))
        limit = data.get("max_output_tokens")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise _bad("'max_output_tokens' must be a positive integer.", "max_output_tokens")
            chat["max_completion_tokens"] = limit
        if data.get("tools") is not None:
            chat["tools"] = _tools(data["tools"]) or None  # chat refuses an empty list
        if data.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(data["tool_choice"])
        fmt = _text_format(data.get("text"))
        if fmt is not None:
            chat["response_format"] = fmt
        effort = _reasoning_effort(data.get("reasoning"))
        if effort is not None:
            chat["reasoning_effort"] = effort
        self.echo = {k: data.get(k) for k in (*_SAME, *_ECHOED, "instructions", "reasoning")}
        self.echo |= {
            "max_output_tokens": data.get("max_output_tokens"),
            "tools": data.get("tools") or [],
            "tool_choice": data.get("tool_choice") or "auto",
            "text": data.get("text") or {"format": {"type": "text"}},
        }
        return chat

    @staticmethod
    def rename(err: APIError | EngineRequestError) -> None:
        """Name the Responses parameters in an error the chat validation or the engine
        raised for the translated request."""
        for pattern, name in _RENAMED:
            if err.param is not None:
                err.param = pattern.sub(name, err.param)
            if not pattern.pattern.startswith("^"):
                err.message = pattern.sub(name, err.message)


# echoed parameter -> (JSON type, its name in errors)
_ECHO_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "metadata": (dict, "an object of strings"),
    "store": (bool, "a boolean"),
    "service_tier": (str, "a string"),
    "safety_identifier": (str, "a string"),
    "prompt_cache_key": (str, "a string"),
    "prompt_cache_retention": (str, "a string"),
    "max_tool_calls": (int, "a positive integer"),
    "stream_options": (dict, "an object"),
}


def _check_echoed(data: dict[str, Any]) -> None:
    """The parameters only echoed must still have their documented types."""
    for name, (kind, what) in _ECHO_TYPES.items():
        value = data.get(name)
        if value is None:
            continue
        wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        wrong = wrong or (name == "max_tool_calls" and value < 1)
        wrong = wrong or (
            name == "metadata" and not all(isinstance(v, str) for v in value.values())
        )
        if wrong:
            raise _bad(f"'{name}' must be {what}.", name)


def _check_truncation(value: Any) -> None:
    if value not in (None, "disabled"):
        raise _unsupported(
            "truncation", "only 'disabled' is available: a too long input is refused, not cut"
        )


def _check_include(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad("'include' must be a list of strings.", "include")
    if "message.output_text.logprobs" in value:
        raise _unsupported("include", "log probabilities are not returned on /v1/responses")


def _messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("'instructions' must be a string.", "instructions")
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _bad("'input' must be a string or a non-empty list of input items.", "input")
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"'{param}' must be an object (an input item).", param)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            _add_tool_call(messages, item, param)
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", param),
                    "content": _content(item.get("output"), f"{param}.output"),
                }
            )
        elif kind == "reasoning":
            continue  # earlier turns' reasoning: chat templates drop it too
        elif kind == "item_reference":
            raise _unsupported(f"{param}.type", f"'item_reference' needs stored items; {_STATEFUL}")
        else:
            raise _unsupported(
                f"{param}.type",
                f"input items of type {kind!r} are not accepted; this server takes message, "
                "function_call, function_call_output and reasoning items",
            )
    return messages


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:  # a list or dict is unhashable
        got = repr(role)[:64] if isinstance(role, str) else f"a JSON {_json_type(role)}"
        raise _bad(
            f"'{param}.role' must be one of user, system, developer, assistant; got {got}.",
            f"{param}.role",
        )
    return {"role": _ROLES[role], "content": _content(item.get("content"), f"{param}.content")}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _content(content: Any, param: str) -> str:
    """Text of a message's content: a string, or a list of text parts joined by newlines
    (as vLLM joins a chat message's text parts: the same parts mean the same prompt
    through either API)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{param}' must be a string or a list of content parts.", param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise _unsupported(
                f"{param}[{j}]", f"{kind} content is not accepted; this server serves text models"
            )
        else:
            raise _bad(
                f"'{param}[{j}]' must be a text part ({{'type': 'input_text', 'text': ...}}).",
                f"{param}[{j}]",
            )
    return "\n".join(texts)


def _string(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise _bad(f"'{param}.{name}' must be a non-empty string.", f"{param}.{name}")
    return value


def _add_tool_call(messages: list[dict[str, Any]], item: dict[str, Any], param: str) -> None:
    """The call joins the assistant turn just before it (its text or other calls)."""
    arguments = item.get("arguments", "")
    if not isinstance(arguments, str):
        raise _bad(f"'{param}.arguments' must be a JSON string.", f"{param}.arguments")
    call = {
        "id": _string(item, "call_id", param),
        "type": "function",
        "function": {"name": _string(item, "name", param), "arguments": arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of tools.", "tools")
    chat_tools = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise _unsupported(
                f"tools[{i}]",
                f"tool type {kind!r} is not available; this server runs function tools only "
                "(no built-in tools such as web_search, file_search or computer use)",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        chat_tools.append({"type": "function", "function": function})
    return chat_tools


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise _bad("'tool_choice.name' must be a function name.", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _unsupported(
        "tool_choice",
        "only 'auto', 'none', 'required' or {'type': 'function', 'name': ...} are accepted",
    )


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _bad("'text' must be an object.", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise _bad(
        "'text.format.type' must be one of text, json_object, json_schema.", "text.format.type"
    )


def _reasoning_effort(reasoning: Any) -> str | None:
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise _bad("'reasoning' must be an object.", "reasoning")
    return reasoning.get("effort")

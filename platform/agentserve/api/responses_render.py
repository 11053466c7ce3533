"""Engine deltas as an OpenAI Responses API object or its server-sent events.

One state machine serves both: each delta's reasoning, text and tool calls extend the
output item being streamed (a reasoning item, an assistant message with one output_text
part, or one function_call item per tool-call index), and a delta of another kind closes
it and opens the next. Streaming turns every step into the events OpenAI sends
(`event: <type>` + `data: <json>`, numbered by sequence_number): response.created,
response.in_progress, then per item output_item.added, content_part.added, the
output_text / reasoning_text / function_call_arguments deltas, their .done events,
content_part.done, output_item.done, and last response.completed (response.incomplete
when max_output_tokens cut the output), which carries the usage. No `[DONE]` follows,
as in OpenAI's and vLLM's Responses streams. A non-stream request gets the final Response.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from agentserve.engine.protocol import Delta, cached_prompt_tokens

__all__ = ["ResponsesBuilder"]

# fields of the request echoed in every Response
_ECHOED = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "reasoning",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "user",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "max_tool_calls",
)
_PART = {"message": "output_text", "reasoning": "reasoning_text"}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesBuilder:
    """Shapes one request's deltas into a Response (id `resp_<request id>`)."""

    def __init__(self, request_id: str, model: str, echo: dict[str, Any]):
        self.id = f"resp_{request_id}"
        self.model = model
        self.echo = echo
        self.created = int(time.time())
        self.items: list[dict[str, Any]] = []  # the output so far, in order
        self.positions: dict[str, int] = {}  # item id -> output_index
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item
        self.finish_reason: str | None = None
        self.tokens = (0, 0, 0)  # prompt, output, prompt tokens the prefix cache served
        self.sequence = 0
        self.events: list[bytes] = []

    # -- the stream frames the ingress writes ----------------------------------------
    def start(self) -> bytes:
        """response.created and response.in_progress."""
        for kind in ("response.created", "response.in_progress"):
            self._emit(kind, response=self._response("in_progress", usage=False))
        return self._flush()

    def delta(self, delta: Delta) -> bytes:
        """The events for one delta (none for an empty one)."""
        self._feed(delta)
        return self._flush()

    def end(self, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> bytes:
        """The open item's .done events and response.completed (or .incomplete)."""
        self.tokens = (prompt_tokens, output_tokens, cached_tokens)
        status = self._finish()
        self._emit(f"response.{status}", response=self._response(status))
        return self._flush()

    def error(self, body: dict[str, Any]) -> bytes:
        """An `error` event for a failure after the stream began (`body`: an OpenAI error
        object, kept under "error" so the openai client raises it)."""
        error = body.get("error") or {}
        self._emit(
            "error",
            code=error.get("code"),
            message=error.get("message") or "the request failed",
            param=error.get("param"),
            error=error,
        )
        return self._flush()

    # -- the non-stream response ---------------------------------------------------------
    def final(self, deltas: list[Delta]) -> dict[str, Any]:
        """The Response for all deltas of a request."""
        for delta in deltas:
            self._feed(delta)
        last = deltas[-1]
        self.tokens = (last.prompt_tokens, last.completion_tokens, last.cached_tokens)
        status = self._finish()
        self.events.clear()
        return self._response(status)

    # -- the state machine ---------------------------------------------------------------
    def _feed(self, delta: Delta) -> None:
        if delta.reasoning:
            self._append("reasoning", delta.reasoning)
        if delta.text:
            self._append("message", delta.text)
        for call in delta.tool_calls:
            self._tool_call(call)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        self.tokens = (delta.prompt_tokens, delta.completion_tokens, delta.cached_tokens)

    def _append(self, kind: str, text: str) -> None:
        item = self.open
        if item is None or item["type"] != kind:
            item = self._open_text_item(kind)
        part = item["content"][0]
        part["text"] += text
        extra = {"logprobs": []} if kind == "message" else {}
        self._emit(
            f"response.{_PART[kind]}.delta",
            **self._where(item),
            content_index=0,
            delta=text,
            **extra,
        )

    def _open_text_item(self, kind: str) -> dict[str, Any]:
        if kind == "message":
            item = {"id": _new_id("msg"), "type": "message", "role": "assistant"}
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
        else:
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": []}
            part = {"type": "reasoning_text", "text": ""}
        item |= {"status": "in_progress", "content": [part]}
        self._open_item(item)
        self._emit(
            "response.content_part.added", **self._where(item), content_index=0, part=_empty(part)
        )
        return item

    def _tool_call(self, call: dict[str, Any]) -> None:
        function = call.get("function") or {}
        item = self.calls.get(call.get("index", 0))
        if item is None:
            item = {
                "id": _new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.get("id") or _new_id("call"),
                "name": function.get("name") or "",
                "arguments": "",
            }
            self.calls[call.get("index", 0)] = item
            self._open_item(item)
        elif function.get("name"):
            item["name"] += function["name"]
        arguments = function.get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            self._emit(
                "response.function_call_arguments.delta", **self._where(item), delta=arguments
            )

    def _open_item(self, item: dict[str, Any]) -> None:
        self._close_open("completed")
        self.positions[item["id"]] = len(self.items)
        self.items.append(item)
        self.open = item
        self._emit(
            "response.output_item.added", output_index=len(self.items) - 1, item=_empty(item)
        )

    def _close_open(self, status: str) -> None:
        item, self.open = self.open, None
        if item is None:
            return
        item["status"] = status
        where = self._where(item)
        if item["type"] == "function_call":
            self._emit(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        else:
            part = item["content"][0]
            extra = {"logprobs": []} if item["type"] == "message" else {}
            self._emit(
                f"response.{part['type']}.done",
                **where,
                content_index=0,
                text=part["text"],
                **extra,
            )
            self._emit("response.content_part.done", **where, content_index=0, part=part)
        self._emit("response.output_item.done", output_index=where["output_index"], item=item)

    def _finish(self) -> str:
        """Close the output (an empty message when there was none); the Response status."""
        status = "incomplete" if self.finish_reason == "length" else "completed"
        if not self.items:
            self._open_text_item("message")
        self._close_open(status)
        return status

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.positions[item["id"]]}

    def _emit(self, kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = json.dumps(payload, separators=(",", ":"))
        self.events.append(f"event: {kind}\ndata: {data}\n\n".encode())

    def _flush(self) -> bytes:
        frames, self.events = b"".join(self.events), []
        return frames

    def _response(self, status: str, *, usage: bool = True) -> dict[str, Any]:
        prompt, output, cached = self.tokens
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": [] if status == "in_progress" else self.items,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "previous_response_id": None,
            "background": False,
            "store": False,  # stateless: nothing is kept
            "truncation": "disabled",
            "usage": None,
        }
        body |= {name: self.echo.get(name) for name in _ECHOED}
        body["parallel_tool_calls"] = self.echo.get("parallel_tool_calls") is not False
        body["metadata"] = self.echo.get("metadata") or {}
        if usage:
            body["usage"] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached_prompt_tokens(prompt, cached)},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + output,
            }
        return body


def _empty(value: dict[str, Any]) -> dict[str, Any]:
    """A copy of an item or part as first announced: no text, arguments or content yet."""
    out = dict(value)
    for key in ("text", "arguments"):
        if key in out:
            out[key] = ""
    if "content" in out:
        out["content"] = []
    return out

"""`agentserve chat`: a tiny terminal chat client on the official `openai` package.

Human mode streams the reply as it is generated, then a dim line with tokens, time to
first token and tokens/s. Plain mode (agents, pipes) prints one JSON line per reply. With
MESSAGE arguments it sends them as one turn and exits; otherwise it reads one turn per
line from stdin until Ctrl-D or Ctrl-C. The conversation history is kept for the session.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentserve.cli.console import Console
from agentserve.sdk.server_env import api_base_url, resolve_api_key, resolve_base_url

__all__ = ["add_parser", "api_base_url", "client_settings", "run_chat"]


def client_settings(args: argparse.Namespace, console: Console | None = None) -> tuple[str, str]:
    """(base URL with /v1, API key or "none") from the flags and the environment
    (agentserve.sdk.server_env: AGENTSERVE_BASE_URL / OPENAI_BASE_URL, AGENTSERVE_API_KEY /
    OPENAI_API_KEY or a key file); a deprecated variable's note goes to the console."""
    base = resolve_base_url(args.url, os.environ)
    if base.note and console is not None:
        console.error(base.note)
    key = resolve_api_key(args.api_key, getattr(args, "api_key_file", None), os.environ)
    return str(base.value), key.value or "none"


@dataclass
class Reply:
    """One assistant turn: text, token counts and timings (seconds)."""

    content: str
    completion_tokens: int | None
    ttft_s: float | None
    total_s: float

    def summary(self) -> str:
        tokens = self.completion_tokens
        rate = tokens / self.total_s if tokens and self.total_s > 0 else None
        parts = [f"{tokens} tokens" if tokens is not None else None]
        parts.append(f"{self.ttft_s * 1000:.0f} ms to first token" if self.ttft_s else None)
        parts.append(f"{rate:.1f} tok/s" if rate else None)
        return ", ".join(p for p in parts if p)


def stream_reply(
    client: Any, model: str, messages: list[dict], args: argparse.Namespace, on_text: Any
) -> Reply:
    """Stream one completion; call on_text(piece) per content delta; return the Reply."""
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=args.max_tokens,
        temperature=args.temperature,
    )
    pieces, first, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text = choice.delta.content or ""
            if text:
                first = first if first is not None else time.perf_counter() - start
                pieces.append(text)
                on_text(text)
    total = time.perf_counter() - start
    return Reply("".join(pieces), usage.completion_tokens if usage else None, first, total)


def _turns(args: argparse.Namespace, console: Console) -> Iterator[str]:
    """User turns: the MESSAGE arguments as one turn, else stdin lines (blank ones skipped)."""
    if args.message:
        yield " ".join(args.message)
        return
    prompt = "" if console.plain or not sys.stdin.isatty() else console.style("you> ", "bold")
    while True:
        try:
            line = input(prompt)
        except EOFError:
            console.say()
            return
        if line.strip():
            yield line


def run_chat(args: argparse.Namespace, console: Console | None = None) -> int:
    """`agentserve chat`: 0 on Ctrl-D/Ctrl-C/end of input, 1 server unreachable or an error
    in one-shot mode (in the interactive loop API errors are shown and the loop goes on)."""
    import openai

    console = console or Console()
    base_url, key = client_settings(args, console)
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    try:
        model = args.model or client.models.list().data[0].id
    except (openai.APIConnectionError, openai.APIStatusError, IndexError) as err:
        console.error(f"cannot list models at {base_url}: {err}")
        return 1
    console.say(console.style(f"chatting with {model} (Ctrl-D or Ctrl-C quits)", "dim"))
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    try:
        for turn in _turns(args, console):
            messages.append({"role": "user", "content": turn})
            try:
                reply = _answer(client, model, messages, args, console)
            except (openai.APIConnectionError, openai.APIStatusError) as err:
                messages.pop()
                console.error(_describe(err))
                if args.message:
                    return 1
                continue
            messages.append({"role": "assistant", "content": reply.content})
    except KeyboardInterrupt:
        console.say()
    return 0


def _describe(err: Exception) -> str:
    status = getattr(err, "status_code", None)
    message = getattr(err, "message", None) or str(err)
    return f"{status}: {message}" if status else message


def _answer(
    client: Any, model: str, messages: list[dict], args: argparse.Namespace, console: Console
) -> Reply:
    if console.plain:
        reply = stream_reply(client, model, messages, args, lambda _: None)
        console.record(
            {
                "role": "assistant",
                "model": model,
                "content": reply.content,
                "completion_tokens": reply.completion_tokens,
                "ttft_s": None if reply.ttft_s is None else round(reply.ttft_s, 4),
                "total_s": round(reply.total_s, 4),
            }
        )
        return reply
    out = console.out

    def show(piece: str) -> None:
        out.write(piece)
        out.flush()

    reply = stream_reply(client, model, messages, args, show)
    console.say()
    console.say(console.style(f"[{reply.summary()}]", "dim"))
    return reply


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `chat` on the CLI's subparsers."""
    p = sub.add_parser(
        "chat",
        help="tiny terminal chat client (streaming, openai package)",
        description="Chat with a served model through the OpenAI API. With MESSAGE: one turn, "
        "then exit. Without: one turn per input line; Ctrl-D or Ctrl-C quits.",
    )
    p.add_argument("message", nargs="*", help="send this as one turn and exit")
    p.add_argument(
        "--url",
        help="API base URL, /v1 optional (default: $AGENTSERVE_BASE_URL, else "
        "$OPENAI_BASE_URL, else the deprecated $AGENTSERVE_URL, else http://127.0.0.1:8000/v1)",
    )
    p.add_argument("--model", help="model id (default: the first of /v1/models)")
    p.add_argument(
        "--api-key",
        help="API key; visible in process lists: prefer $AGENTSERVE_API_KEY, $OPENAI_API_KEY "
        "or --api-key-file (none needed in open mode)",
    )
    p.add_argument(
        "--api-key-file",
        help="read the API key from this file (default: $AGENTSERVE_API_KEY_FILE when no key "
        "variable is set)",
    )
    p.add_argument("--system", help="system message for the conversation")
    p.add_argument(
        "--max-tokens", type=int, default=None, help="per reply (default: the server's limit)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.7, help="sampling temperature (default: %(default)s)"
    )
    p.set_defaults(handler=run_chat)

"""A two-turn chat with the plain `openai` client against agentserve.

Start the platform first (`agentserve up`), then: python examples/01-chat/chat.py
Env: AGENTSERVE_BASE_URL (default http://127.0.0.1:8000/v1), AGENTSERVE_API_KEY (default
"none": open mode), AGENTSERVE_MODEL (default the bundled smollm2-135m-instruct).
"""

from __future__ import annotations

import os
import uuid

from openai import OpenAI

QUESTIONS = ("Name three prime numbers.", "Which of them is the largest?")


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("AGENTSERVE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("AGENTSERVE_API_KEY", "none"),
    )
    model = os.environ.get("AGENTSERVE_MODEL", "smollm2-135m-instruct")
    # one conversation = one session: agentserve keeps it on one replica (warm KV cache)
    session = {"x-session-id": f"chat-{uuid.uuid4().hex[:12]}"}
    messages: list[dict] = []
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        print(f"user: {question}")
        if turn == 0:  # a whole reply at once
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=64, extra_headers=session
            )
            text = reply.choices[0].message.content or ""
            print(f"assistant: {text}")
        else:  # streamed token by token
            print("assistant: ", end="", flush=True)
            stream = client.chat.completions.create(
                model=model, messages=messages, max_tokens=64, stream=True, extra_headers=session
            )
            text = ""
            for chunk in stream:
                piece = (chunk.choices[0].delta.content or "") if chunk.choices else ""
                text += piece
                print(piece, end="", flush=True)
            print()
        messages.append({"role": "assistant", "content": text})


if __name__ == "__main__":
    main()

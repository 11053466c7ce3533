"""The close stage (serve/stages.py): each stage's undo goes on the request's one
AsyncExitStack as it is taken; closing runs them in reverse order, then records the
request, once, even when closed twice or when an undo fails."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.serve.stages import Close, Held
from opentelemetry.trace import NoOpTracer


class _Close(Close):
    def __init__(self, done: list[str]):
        super().__init__(admit=None)
        self.done = done

    def record(self, held: Held) -> None:
        self.done.append(f"record {held.status}")


def _held(done: list[str]) -> tuple[Held, Close]:
    close = _Close(done)
    return Held.start(NoOpTracer(), "chat", {}, close), close


def test_undos_run_in_reverse_then_the_record_once():
    done: list[str] = []
    held, close = _held(done)
    held.undo.callback(done.append, "give back the places")  # Admit
    held.undo.callback(done.append, "free the slots")  # Dispatch
    held.finish(200)

    async def twice():
        await close(held)
        await close(held)

    asyncio.run(twice())
    assert done == ["free the slots", "give back the places", "record 200"]


def test_a_failing_undo_leaves_none_of_the_others_undone():
    done: list[str] = []
    held, close = _held(done)
    held.undo.callback(done.append, "give back the places")

    def broken() -> None:
        raise RuntimeError("stream close failed")

    held.undo.callback(broken)
    with pytest.raises(RuntimeError):
        asyncio.run(close(held))
    assert done == ["give back the places", "record None"]

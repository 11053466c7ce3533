"""The OpenAI Agents SDK's default model interface, the Responses API
(OpenAIResponsesModel), against the ingress's /v1/responses (ASGI, fake engine)."""

from __future__ import annotations

import asyncio

import pytest
from test_responses_api import Served

agents = pytest.importorskip("agents")


def _agent(served: Served, **kwargs):
    from agents import Agent, OpenAIResponsesModel

    model = OpenAIResponsesModel(model="m", openai_client=served.client())
    return Agent(name="solo", model=model, **kwargs)


def _run(agent, prompt: str, *, streamed: bool = False):
    from agents import RunConfig, Runner

    config = RunConfig(tracing_disabled=True)

    async def run():
        if not streamed:
            return await Runner.run(agent, prompt, max_turns=3, run_config=config)
        result = Runner.run_streamed(agent, prompt, max_turns=3, run_config=config)
        async for _ in result.stream_events():
            pass
        return result

    return asyncio.run(run())


@pytest.mark.parametrize("streamed", [False, True])
def test_one_turn_agent_over_responses(streamed):
    served = Served()
    result = _run(_agent(served, instructions="be brief"), "hi there", streamed=streamed)
    assert result.final_output == "echo: hi there"
    (raw,) = result.raw_responses
    assert raw.response_id.startswith("resp_") and raw.usage.output_tokens == 3
    (request,) = served.engine.requests
    assert [m["role"] for m in request.body.messages] == ["system", "user"]
    assert request.body.stream is streamed


@pytest.mark.parametrize("streamed", [False, True])
def test_agent_tool_round_trip_over_responses(streamed):
    from agents import ModelSettings, function_tool

    seen = []

    @function_tool
    def lookup(word: str) -> str:
        """Look a word up."""
        seen.append(word)
        return f"{word} is a small animal"

    served = Served()
    required = ModelSettings(tool_choice="required")
    agent = _agent(served, tools=[lookup], model_settings=required)
    result = _run(agent, "define cat", streamed=streamed)
    assert seen == ["define cat"]
    assert result.final_output == "echo: define cat"
    first, second = served.engine.requests
    assert first.body.tool_choice == "required" and second.body.tool_choice in (None, "auto")
    roles = [m["role"] for m in second.body.messages]
    assert roles == ["user", "assistant", "tool"]
    call_id = second.body.messages[1]["tool_calls"][0]["id"]
    assert second.body.messages[2] == {
        "role": "tool",
        "tool_call_id": call_id,
        "content": "define cat is a small animal",
    }

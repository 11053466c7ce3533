"""agentserve.sdk over the in-process ingress and fake engine (ASGI transport, no Ray):
one trace from the workflow through agents, tools and sub-agents to the chat calls and
the server spans; session header; tool errors and timeouts reach the model; max turns;
Pydantic AI's own GenAI spans joined the same way."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from agentserve import sdk
from agentserve import tracing as t
from agentserve.sdk.connect import CAPTURE_ENV
from agentserve.sdk.otel import format_tree
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, TracingSpec
from agentserve_bench.fake_engine import FakeEngine
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

agents = pytest.importorskip("agents")
MODEL = "m"


class Platform:
    """The ingress + fake engine in this process, with its server spans in memory."""

    def __init__(self):
        spec = DeploymentSpec.model_validate(
            {
                "models": [{"name": MODEL, "engine": "fake", "max_model_len": 4096}],
                "server": {"trusted_hosts": ["agentserve.test"]},  # the URL connect() uses
            }
        )
        self.spans = InMemorySpanExporter()
        tracer = t.make_tracer(TracingSpec(), {}, "server", exporter=self.spans)
        self.engine = FakeEngine(MODEL, 4096)
        asyncio.run(self.engine.start())
        app = create_app(spec, {MODEL: LocalBackend(self.engine, tracer)}, tracer=tracer)
        self.transport = httpx2.ASGITransport(app=app)

    def connect(self, **kwargs) -> sdk.Connection:
        return sdk.connect(
            "http://agentserve.test/v1",
            "none",
            MODEL,
            transport=self.transport,
            set_global_provider=False,
            **kwargs,
        )


@pytest.fixture
def platform():
    return Platform()


def _team():
    from agents import Agent, ModelSettings, function_tool

    @function_tool
    def search_files(query: str) -> str:
        """Find files mentioning `query`."""
        return f"found 2 files for {query!r}"

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        raise ValueError(f"cannot evaluate {expression!r}")

    required = ModelSettings(tool_choice="required")
    researcher = Agent(name="researcher", tools=[search_files], model_settings=required)
    coder = Agent(name="coder", tools=[calculator], model_settings=required)
    return Agent(
        name="coordinator",
        tools=[
            researcher.as_tool(tool_name="research", tool_description="Research a question."),
            coder.as_tool(tool_name="code", tool_description="Write or run code."),
        ],
        model_settings=required,
    )


def _names(spans):
    return {s.name for s in spans}


def test_multi_agent_run_is_one_trace_from_workflow_to_decode(platform):
    from agents import Runner, trace

    conn = platform.connect()
    assert conn.frameworks[0] == "openai-agents"

    async def run():
        with trace("task", group_id="conv-42"):
            return await Runner.run(_team(), "compare two files", max_turns=4)

    result = asyncio.run(run())
    assert result.final_output.startswith("echo:")
    client_spans = conn.recorder.spans()
    server_spans = platform.spans.get_finished_spans()
    assert {
        "invoke_workflow task",
        "invoke_agent coordinator",
        "execute_tool research",
        "execute_tool code",
        "invoke_agent researcher",
        "invoke_agent coder",
        "execute_tool search_files",
        "execute_tool calculator",
        f"chat {MODEL}",
    } <= _names(client_spans)
    assert {"ingress", "queue_wait", "replica", "prefill", "decode"} <= _names(server_spans)
    everything = [*client_spans, *server_spans]
    assert len({s.context.trace_id for s in everything}) == 1
    by_id = {s.context.span_id: s for s in everything}

    def ancestry(span):
        names = []
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
            names.append(span.name)
        return names

    decode = next(s for s in server_spans if s.name == "decode")
    chain = ancestry(decode)
    assert chain[:3] == ["replica", "ingress", f"chat {MODEL}"]
    calc = next(s for s in client_spans if s.name == "execute_tool calculator")
    assert ancestry(calc)[:3] == [
        "invoke_agent coder",
        "execute_tool code",
        "invoke_agent coordinator",
    ]
    assert calc.status.status_code.name == "ERROR"  # the run went on: the model saw the error
    chat = next(s for s in client_spans if s.name == f"chat {MODEL}")
    assert chat.attributes[t.OPERATION] == "chat" and chat.attributes[t.REQUEST_MODEL] == MODEL
    assert chat.attributes["server.address"] == "agentserve.test"  # the URL connect() used
    assert chat.attributes["server.port"] == 80
    assert chat.attributes[t.INPUT_TOKENS] > 0 and chat.attributes[t.OUTPUT_TOKENS] > 0
    assert chat.attributes[t.FINISH_REASONS] in (("tool_calls",), ("stop",))
    assert chat.attributes[t.CONVERSATION_ID] == "conv-42"
    agent = next(s for s in client_spans if s.name == "invoke_agent coordinator")
    assert agent.attributes[t.AGENT_NAME] == "coordinator"
    assert {r.headers.get("x-session-id") for r in platform.engine.requests} == {"conv-42"}
    tree = conn.trace_tree()
    assert tree.splitlines()[0].startswith("invoke_workflow task")
    assert "execute_tool calculator" in tree
    root = next(s for s in client_spans if s.name == "invoke_workflow task")
    assert root.attributes[t.OPERATION] == "invoke_workflow"
    assert root.attributes[t.WORKFLOW_NAME] == "task"
    # each tool span carries the id of the call it ran: the coordinator's two calls, as
    # its run recorded them, and each sub-agent's own call
    called = {
        item.raw_item.name: item.raw_item.call_id
        for item in result.new_items
        if item.type == "tool_call_item"
    }
    assert set(called) == {"research", "code"} and len(set(called.values())) == 2
    for name, call_id in called.items():
        tool = next(s for s in client_spans if s.name == f"execute_tool {name}")
        assert tool.attributes[t.TOOL_CALL_ID] == call_id
        assert tool.attributes[t.TOOL_TYPE] == "function"
    assert calc.attributes[t.TOOL_CALL_ID].startswith("call_")


def test_tool_call_ids_are_left_out_when_the_run_records_no_data(platform):
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool

    @function_tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    conn = platform.connect()
    agent = Agent(name="a", tools=[echo], model_settings=ModelSettings(tool_choice="required"))
    config = RunConfig(trace_include_sensitive_data=False)
    asyncio.run(Runner.run(agent, "hi", max_turns=3, run_config=config))
    tool = next(s for s in conn.recorder.spans() if s.name == "execute_tool echo")
    assert t.TOOL_CALL_ID not in tool.attributes  # not guessed


def test_conversation_context_sets_the_session_header(platform):
    from agents import Agent, Runner

    platform.connect()

    async def run():
        with sdk.conversation("chat-7"):
            return await Runner.run(Agent(name="solo"), "hi there")

    assert asyncio.run(run()).final_output == "echo: hi there"
    (request,) = platform.engine.requests
    assert request.headers["x-session-id"] == "chat-7"
    assert t.valid_traceparent(request.headers["traceparent"])


def test_max_turns_guard_stops_a_looping_agent(platform):
    from agents import Agent, ModelSettings, Runner, function_tool
    from agents.exceptions import MaxTurnsExceeded

    @function_tool
    def again(text: str) -> str:
        """Loop forever."""
        return text

    looping = Agent(
        name="loop",
        tools=[again],
        model_settings=ModelSettings(tool_choice="required"),
        reset_tool_choice=False,
    )
    platform.connect()
    with pytest.raises(MaxTurnsExceeded):
        asyncio.run(Runner.run(looping, "go", max_turns=3))


def test_tool_timeout_becomes_a_tool_result(platform):
    from agents import Agent, ModelSettings, Runner, function_tool

    @function_tool(timeout=0.05)
    async def slow(text: str) -> str:
        """Too slow."""
        await asyncio.sleep(5)
        return text

    agent = Agent(name="a", tools=[slow], model_settings=ModelSettings(tool_choice="required"))
    conn = platform.connect(capture_content=True)
    result = asyncio.run(Runner.run(agent, "wait", max_turns=3))
    assert result.final_output.startswith("echo:")
    tool = next(s for s in conn.recorder.spans() if s.name == "execute_tool slow")
    assert "timed out" in str(tool.attributes.get("gen_ai.tool.call.result", "")).lower()


def test_content_is_not_recorded_unless_asked(platform, monkeypatch):
    """Prompts, completions and tool results are opt-in in the GenAI conventions (user data,
    secrets): none is on a span by default, from either framework."""
    from agents import Agent, Runner, function_tool

    @function_tool
    def vault(name: str) -> str:
        """Reads a secret."""
        return "hunter2-secret"

    monkeypatch.delenv(CAPTURE_ENV, raising=False)
    conn = platform.connect()
    asyncio.run(Runner.run(Agent(name="a", tools=[vault]), "my password is hunter2"))
    pydantic_ai = pytest.importorskip("pydantic_ai")
    helper = pydantic_ai.Agent(conn.pydantic_ai_model(), name="helper")
    asyncio.run(helper.run("my password is hunter2"))
    recorded = str([dict(s.attributes) for s in conn.recorder.spans()])
    assert "hunter2" not in recorded
    monkeypatch.setenv(CAPTURE_ENV, "true")  # the conventions' own switch turns it on
    conn = platform.connect()
    asyncio.run(helper.run("my password is hunter2"))
    assert "hunter2" in str([dict(s.attributes) for s in conn.recorder.spans()])


def test_pydantic_ai_spans_join_the_server_trace(platform):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    conn = platform.connect()
    assert "pydantic-ai" in conn.frameworks
    agent = pydantic_ai.Agent(conn.pydantic_ai_model(), name="helper")

    @agent.tool_plain
    def lookup(text: str) -> str:
        """Look something up."""
        return "42"

    result = asyncio.run(agent.run("what is it", conversation_id="conv-p"))
    assert result.output.startswith("echo:")
    client = conn.recorder.spans()
    assert {"invoke_agent helper", f"chat {MODEL}"} <= _names(client)
    server = platform.spans.get_finished_spans()
    ingress = next(s for s in server if s.name == "ingress")
    chat = next(s for s in client if s.name == f"chat {MODEL}")
    assert ingress.parent.span_id == chat.context.span_id
    assert ingress.context.trace_id == chat.context.trace_id
    assert platform.engine.requests[0].headers.get("x-session-id") == "conv-p"


def test_format_tree_orders_children_under_parents(platform):
    from agents import Agent, Runner

    conn = platform.connect()
    asyncio.run(Runner.run(Agent(name="solo"), "hi"))
    tree = format_tree(conn.recorder.spans())
    lines = tree.splitlines()
    assert lines[1].startswith("  invoke_agent solo") and lines[2].startswith("    chat m")


def test_streamed_run_is_traced_the_same_way(platform):
    from agents import Agent, Runner

    conn = platform.connect()

    async def run():
        result = Runner.run_streamed(Agent(name="streamer"), "stream this please")
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(run()) == "echo: stream this please"
    chat = next(s for s in conn.recorder.spans() if s.name == f"chat {MODEL}")
    # a stream's finish reason and usage are not known to the SDK here: left out, not made
    # up (the ingress span has the real ones)
    assert t.FINISH_REASONS not in chat.attributes and t.INPUT_TOKENS not in chat.attributes
    ingress = next(s for s in platform.spans.get_finished_spans() if s.name == "ingress")
    assert ingress.attributes[t.FINISH_REASONS] == ("stop",)
    assert ingress.parent.span_id == chat.context.span_id


def test_a_streamed_run_gives_tool_spans_their_call_ids(platform):
    """A streamed run records a Responses-shaped dump as the model call's output, not
    Chat Completions messages: the call ids come from its function_call items."""
    from agents import Agent, ModelSettings, Runner, function_tool

    @function_tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    conn = platform.connect()
    agent = Agent(name="s", tools=[lookup], model_settings=ModelSettings(tool_choice="required"))

    async def run():
        result = Runner.run_streamed(agent, "find it", max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    call_ids = [i.raw_item.call_id for i in result.new_items if i.type == "tool_call_item"]
    tool = next(s for s in conn.recorder.spans() if s.name == "execute_tool lookup")
    assert len(call_ids) == 1 and tool.attributes[t.TOOL_CALL_ID] == call_ids[0]


def test_a_chat_span_without_a_known_model_names_none():
    """gen_ai.request.model is required "if available": left out, not "unknown"."""
    from types import SimpleNamespace

    from agentserve.sdk.agents_tracing import GenAITraceProcessor
    from opentelemetry.trace import NoOpTracer

    processor = GenAITraceProcessor(NoOpTracer(), default_model=None)
    name, _, attrs = processor._describe_start(SimpleNamespace(type="generation", model=None))
    assert name == "chat" and t.REQUEST_MODEL not in attrs and attrs[t.OPERATION] == "chat"
    name, _, attrs = processor._describe_start(SimpleNamespace(type="generation", model="x"))
    assert name == "chat x" and attrs[t.REQUEST_MODEL] == "x"
    config = {"temperature": 0.2, "top_p": None, "max_tokens": 9, "base_url": "https://h:8443/v1"}
    data = SimpleNamespace(type="generation", model="x", model_config=config)
    _, _, attrs = processor._describe_start(data)
    assert attrs["gen_ai.request.temperature"] == 0.2 and attrs["gen_ai.request.max_tokens"] == 9
    assert "gen_ai.request.top_p" not in attrs  # not set
    assert attrs["server.address"] == "h" and attrs["server.port"] == 8443

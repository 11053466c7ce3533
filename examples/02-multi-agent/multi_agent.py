"""A coordinator agent delegating to a researcher and a coder sub-agent, each with a real
tool, written with the OpenAI Agents SDK and run on agentserve; prints the answer and the
trace tree (agents -> tools/sub-agents -> model calls).

Start the platform first (`agentserve up --traces` also starts the Phoenix trace UI), then:
    python examples/02-multi-agent/multi_agent.py ["your question"]
With OTEL_EXPORTER_OTLP_ENDPOINT set (`up --traces` prints it) the whole trace, server
spans included, is in the trace UI under the printed trace id.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import operator
import uuid
from pathlib import Path

import agentserve.sdk  # changed line 1 of 2
from agents import Agent, ModelSettings, Runner, function_tool, trace
from agents.exceptions import MaxTurnsExceeded

ROOT = Path(__file__).resolve().parent
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def _evaluate(node: ast.AST) -> float:
    """Arithmetic only: numbers, + - * / ** and unary minus; anything else is an error."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


@function_tool(timeout=5)  # per-call timeouts need async tools
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 2 * (3 + 4)."""
    return str(_evaluate(ast.parse(expression, mode="eval").body))  # errors go to the model


@function_tool(timeout=5)
async def search_files(query: str) -> str:
    """Find lines containing `query` in the example's files."""
    return await asyncio.to_thread(_search, query)


def _search(query: str) -> str:
    hits = []
    for path in sorted(ROOT.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if query.lower() in line.lower():
                    hits.append(f"{path.name}:{number}: {line.strip()}")
    return "\n".join(hits[:10]) or f"no file mentions {query!r}"


def build_team() -> Agent:
    """coordinator -> (researcher -> search_files, coder -> calculator)."""
    use_tools = ModelSettings(tool_choice="required", max_tokens=128)  # call a tool first
    researcher = Agent(
        name="researcher",
        instructions="Answer from the files: call search_files with a keyword.",
        tools=[search_files],
        model_settings=use_tools,
    )
    coder = Agent(
        name="coder",
        instructions="Compute what is asked: call calculator with an arithmetic expression.",
        tools=[calculator],
        model_settings=use_tools,
    )
    return Agent(
        name="coordinator",
        instructions="Delegate: research questions to research, arithmetic to code. "
        "Then answer in one sentence.",
        tools=[
            researcher.as_tool(tool_name="research", tool_description="Look things up."),
            coder.as_tool(tool_name="code", tool_description="Compute things."),
        ],
        model_settings=use_tools,
    )


async def run(question: str, conversation_id: str) -> str:
    with trace("multi-agent task", group_id=conversation_id):  # one trace per task
        try:
            result = await Runner.run(build_team(), question, max_turns=6)
        except MaxTurnsExceeded:  # the guard against an agent that keeps calling tools
            return "(stopped: the coordinator used all 6 turns)"
    return str(result.final_output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="What does search_files do? Also 6*7?")
    args = parser.parse_args()
    connection = agentserve.sdk.connect(service_name="multi-agent-example")  # changed line 2
    answer = asyncio.run(run(args.question, f"task-{uuid.uuid4().hex[:12]}"))
    connection.flush()
    print(f"answer: {answer}\n")
    print(connection.trace_tree())
    print(f"\ntrace id: {connection.last_trace_id()}")
    if connection.export_endpoint:
        print(f"exported to {connection.export_endpoint} (server spans join the same trace)")


if __name__ == "__main__":
    main()

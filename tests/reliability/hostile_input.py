"""Hostile and malformed input scenarios: explicit bad requests, each with its exact
OpenAI error, against the ingress over the fake engine (generated bodies: fuzz.py).

Both drive the real ingress app (serve/ingress.create_app) in process, the model served
by a FakeEngine through LocalBackend: what is checked is the HTTP edge, which is the same
code in front of vLLM. A case is "lost" when its answer is not a well-formed one: a 5xx,
a 4xx whose body is not {"error": {message, type, param, code}}, a 200 that is not an
OpenAI response, or a stream that does not end with [DONE]. "restarts" counts engine
health-check failures seen after a case (each would make Serve replace the replica).
"""

from __future__ import annotations

import asyncio
import json
import pickle
from dataclasses import dataclass, field
from typing import Any

from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.scenario import Outcome, scenario

__all__ = [
    "HOSTILE_CASES",
    "MODEL",
    "Case",
    "check_answer",
    "engine_down",
    "fuzz_client",
    "run_case",
]

MODEL = "m"
CONTEXT = 64
MSG = [{"role": "user", "content": "hello there"}]
ERROR_FIELDS = {"message", "type", "param", "code"}
BAD = "invalid_request_error"


@dataclass(frozen=True)
class Case:
    """One explicit hostile request and the error it must get (None = not checked)."""

    name: str
    body: bytes | dict[str, Any]
    status: int
    param: str | None = None
    code: str | None = None
    contains: str = ""
    path: str = "/v1/chat/completions"
    headers: dict[str, str] = field(default_factory=dict)
    type: str = BAD


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MSG, **fields}


def _tool(name: str = "lookup", parameters: Any = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


HOSTILE_CASES: tuple[Case, ...] = (
    Case("malformed JSON", b'{"model": "m", "messages": [', 400, contains="not valid JSON"),
    Case("body is a JSON array", b"[1, 2]", 400, contains="must be a JSON object"),
    Case("empty body", b"", 400, contains="not valid JSON"),
    Case("messages wrong type", _chat(messages="hi"), 400, "messages", contains="valid list"),
    Case("model wrong type", _chat(model=7), 400, "model", contains="valid string"),
    Case("max_tokens wrong type", _chat(max_tokens="ten"), 400, "max_tokens"),
    Case(
        "message content parts not objects",
        _chat(messages=[{"role": "user", "content": [1, 2]}]),
        400,
        "messages[0].content",
        contains="messages[0].content[0]",
    ),
    Case(
        "message content part text not a string",
        _chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
        400,
        "messages[0].content",
    ),
    Case(
        "message content an object, not a list",
        _chat(messages=[{"role": "system", "content": {"type": "text", "text": "hi"}}]),
        400,
        "messages[0].content",
    ),
    Case("n a boolean", _chat(n=True), 400, "n", contains="must be an integer"),
    Case("max_tokens a boolean", _chat(max_tokens=True), 400, "max_tokens"),
    Case("seed a string", _chat(seed="1"), 400, "seed", contains="not a JSON string"),
    Case("stream a string", _chat(stream="yes"), 400, "stream", contains="a boolean"),
    Case("chat logprobs a string", _chat(logprobs="yes"), 400, "logprobs"),
    Case(
        "completion logprobs a boolean",
        {"model": MODEL, "prompt": "hi", "logprobs": True},
        400,
        "logprobs",
        path="/v1/completions",
    ),
    Case(
        "max_completion_tokens zero",
        _chat(max_completion_tokens=0, max_tokens=5),
        400,
        "max_completion_tokens",
    ),
    Case(
        "message content wrong type",
        _chat(messages=[{"role": "user", "content": 5}]),
        400,
        "messages[0].content",
    ),
    Case("missing messages", {"model": MODEL}, 400, "messages", contains="Field required"),
    Case("missing model", {"messages": MSG}, 400, "model"),
    Case("missing prompt", {"model": MODEL}, 400, "prompt", path="/v1/completions"),
    Case("empty messages", _chat(messages=[]), 400, "messages"),
    Case(
        "huge body (8 MiB > 4 MiB limit)",
        _chat(messages=[{"role": "user", "content": "w" * (8 << 20)}]),
        413,
        code="request_too_large",
        contains="at most 4194304 bytes",
    ),
    Case(
        "deeply nested JSON (100k levels)",
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        contains="nested too deep",
    ),
    Case(
        "nesting past 64 levels",
        _chat(metadata=json.loads("[" * 70 + "]" * 70)),
        400,
        "metadata",
        contains="nests deeper than 64",
    ),
    Case(
        "huge max_tokens",
        _chat(max_tokens=10**12),
        400,
        "max_tokens",
        "context_length_exceeded",
        "maximum context length is 64 tokens",
    ),
    Case(
        "max_tokens past 64-bit",
        _chat(max_completion_tokens=2**70),
        400,
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    Case("max_tokens zero", _chat(max_tokens=0), 400, "max_tokens", contains="positive integer"),
    Case("negative temperature", _chat(temperature=-1), 400, "temperature"),
    Case(
        "temperature NaN",
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":NaN}',
        400,
        "temperature",
        contains="finite number",
    ),
    Case(
        "top_p Infinity",
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"top_p":Infinity}',
        400,
        "top_p",
        contains="finite number",
    ),
    Case(
        "frequency_penalty -Infinity",
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"frequency_penalty":-Infinity}',
        400,
        "frequency_penalty",
    ),
    Case(
        "presence_penalty 100",
        _chat(presence_penalty=100),
        400,
        "presence_penalty",
        contains="[-2, 2]",
    ),
    Case("negative top_k", _chat(top_k=-5), 400, "top_k"),
    Case("min_p above 1", _chat(min_p=1.5), 400, "min_p"),
    Case("negative repetition_penalty", _chat(repetition_penalty=-1), 400, "repetition_penalty"),
    Case("n = 9", _chat(n=9), 400, "n"),
    Case("top_logprobs 1000", _chat(logprobs=True, top_logprobs=1000), 400, "top_logprobs"),
    Case("seed past 64-bit", _chat(seed=2**80), 400, "seed"),
    Case(
        "integer with 5000 digits",
        b'{"model":"m","messages":[],"seed":' + b"9" * 5000 + b"}",
        400,
        contains="not valid JSON",
    ),
    Case("logit_bias non-integer key", _chat(logit_bias={"abc": 1}), 400, "logit_bias"),
    Case(
        "unknown model",
        _chat(model="gpt-17"),
        404,
        "model",
        "model_not_found",
        "does not exist",
    ),
    Case(
        "prompt over the context window",
        _chat(messages=[{"role": "user", "content": "w " * 100}]),
        400,
        "messages",
        "context_length_exceeded",
        "the request has 101 prompt tokens",
    ),
    Case(
        "token prompt over the context window",
        {"model": MODEL, "prompt": list(range(80))},
        400,
        "prompt",
        "context_length_exceeded",
        "the request has 80 prompt tokens",
        path="/v1/completions",
    ),
    Case(
        "invalid UTF-8 bytes",
        b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}',
        400,
        contains="not valid UTF-8",
    ),
    Case(
        "unpaired surrogate escape",
        b'{"model":"m","messages":[{"role":"user","content":"a\\ud800b"}]}',
        400,
        "messages[0].content",
        contains="not valid Unicode",
    ),
    Case(
        "too many stop sequences (1000)",
        _chat(stop=[f"s{i}" for i in range(1000)]),
        400,
        "stop",
        "too_many_items",
        "at most 4 are accepted",
    ),
    Case("empty stop string", _chat(stop=[""]), 400, "stop", contains="empty string"),
    Case("a 1 MiB stop string", _chat(stop="s" * (1 << 20)), 400, "stop[0]", "value_too_long"),
    Case("33 bad words", _chat(bad_words=["w"] * 33), 400, "bad_words", "too_many_items"),
    Case(
        "logit_bias with 301 entries",
        _chat(logit_bias={str(i): 1 for i in range(301)}),
        400,
        "logit_bias",
        "too_many_items",
        "at most 300",
    ),
    Case(
        "a 64 KiB grammar",
        _chat(structured_outputs={"grammar": "root ::= " + '"a" ' * 16384}),
        400,
        "structured_outputs.grammar",
        "structured_output_too_large",
    ),
    Case(
        "tool schema with invalid type",
        _chat(tools=[_tool(parameters={"type": "nonsense"})]),
        400,
        "tools[0].function.parameters",
        contains="Invalid JSON Schema",
    ),
    Case(
        "tool schema not an object",
        _chat(tools=[_tool(parameters="{}")]),
        400,
        "tools[0].function.parameters",
    ),
    Case(
        "tool schema bad required",
        _chat(tools=[_tool(parameters={"required": "x"})]),
        400,
        "tools[0].function.parameters",
    ),
    Case(
        "tool name with spaces", _chat(tools=[_tool(name="do it!")]), 400, "tools[0].function.name"
    ),
    Case("tool without function", _chat(tools=[{"type": "function"}]), 400, "tools[0].function"),
    Case("tool_choice without tools", _chat(tool_choice="required"), 400, "tool_choice"),
    Case(
        "tool_choice unknown string",
        _chat(tools=[_tool()], tool_choice="sometimes"),
        400,
        "tool_choice",
    ),
    Case(
        "tool_choice names a missing tool",
        _chat(tools=[_tool()], tool_choice={"type": "function", "function": {"name": "other"}}),
        400,
        "tool_choice",
    ),
    Case(
        "response_format with invalid JSON Schema",
        _chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 3}},
            }
        ),
        400,
        "response_format.json_schema.schema",
    ),
    Case(
        "response_format unknown type",
        _chat(response_format={"type": "yaml"}),
        400,
        "response_format.type",
    ),
    Case(
        "stream_options without stream",
        _chat(stream_options={"include_usage": True}),
        400,
        "stream_options",
    ),
    Case("unknown route", _chat(), 404, path="/v1/chat/complete"),
)


class PicklingBackend(LocalBackend):
    """LocalBackend whose requests cross a serialisation boundary as they do to a Ray
    replica (a Serve handle pickles its arguments): a request that validated but cannot
    be pickled would be a 500 in a real deployment, so here too."""

    def generate(self, request: Any) -> Any:
        import ray.cloudpickle  # what Serve pickles handle arguments with

        return super().generate(pickle.loads(ray.cloudpickle.dumps(request)))


def fuzz_client(context: int = CONTEXT, **server: Any) -> tuple[Any, Any]:
    """(TestClient over the ingress app, its FakeEngine) in open mode; server errors come
    back as responses (raise_server_exceptions=False), as a real client would see them."""
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily
    from fastapi.testclient import TestClient

    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": MODEL, "engine": "fake", "max_model_len": context}],
            "server": server,
        }
    )
    engine = FakeEngine(MODEL, context)
    asyncio.run(engine.start())
    app = create_app(spec, {MODEL: PicklingBackend(engine)})
    # as a local client sends it: a trusted Host and a JSON body (serve/host_guard.py)
    headers = {"content-type": "application/json"}
    client = TestClient(
        app, base_url="http://localhost", headers=headers, raise_server_exceptions=False
    )
    return client, engine


def _encode(body: bytes | dict[str, Any]) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def run_case(client: Any, case: Case) -> dict[str, Any]:
    """Send one case; the response's status and error fields, and what did not match."""
    r = client.post(case.path, content=_encode(case.body), headers=case.headers)
    try:
        error = r.json().get("error") or {}
    except ValueError:
        error = {}
    got = {
        "status": r.status_code,
        "type": error.get("type"),
        "param": error.get("param"),
        "code": error.get("code"),
        "message": error.get("message"),
    }
    wrong = [f"status {r.status_code} != {case.status}"] if r.status_code != case.status else []
    if set(error) != ERROR_FIELDS or not error.get("message"):
        wrong.append(f"not an OpenAI error body: {r.text[:200]}")
    if error.get("type") != case.type:
        wrong.append(f"type {error.get('type')!r} != {case.type!r}")
    for name in ("param", "code"):
        if getattr(case, name) is not None and error.get(name) != getattr(case, name):
            wrong.append(f"{name} {error.get(name)!r} != {getattr(case, name)!r}")
    if case.contains and case.contains not in (error.get("message") or ""):
        wrong.append(f"message lacks {case.contains!r}")
    return {**got, "wrong": wrong}


def check_answer(r: Any, stream: bool) -> str | None:
    """None when `r` is a well-formed answer (OpenAI response, error or stream), else why."""
    if r.status_code >= 500:
        return f"{r.status_code}: {r.text[:200]}"
    if r.status_code >= 400:
        try:
            error = r.json()["error"]
        except (ValueError, KeyError, TypeError):
            return f"{r.status_code} without an OpenAI error body: {r.text[:200]}"
        if set(error) != ERROR_FIELDS or not isinstance(error["message"], str):
            return f"{r.status_code} error body has fields {sorted(error)}"
        return None
    if stream and r.headers.get("content-type", "").startswith("text/event-stream"):
        lines = [x[6:] for x in r.text.splitlines() if x.startswith("data: ")]
        if not lines or lines[-1] != "[DONE]":
            return "stream does not end with [DONE]"
        if any("error" in json.loads(x) for x in lines[:-1]):
            return "stream carries an error event"
        return None
    body = r.json()
    if not isinstance(body, dict) or not ({"choices", "data"} & set(body)):
        return f"200 that is not an OpenAI response: {r.text[:200]}"
    return None


@scenario("input_explicit_cases")
def explicit_cases() -> Outcome:
    """Explicit hostile requests (malformed JSON, wrong types, huge bodies, NaN, context,
    bad UTF-8, stop, tools...): each must get its exact OpenAI error."""
    client, engine = fuzz_client()
    records, lost, errors_5xx, restarts = {}, 0, 0, 0
    for case in HOSTILE_CASES:
        record = run_case(client, case)
        records[case.name] = record
        errors_5xx += record["status"] >= 500
        lost += record["status"] >= 500 or any("OpenAI error" in w for w in record["wrong"])
        restarts += engine_down(engine)
    mismatched = {n: r["wrong"] for n, r in records.items() if r["wrong"]}
    return Outcome(
        requests=len(HOSTILE_CASES),
        lost=lost,
        errors_5xx=errors_5xx,
        restarts=restarts,
        details={"mismatched": mismatched, "cases": records},
    )


def engine_down(engine: Any) -> bool:
    try:
        asyncio.run(engine.health())
    except Exception:  # any failure is what a Serve health check would act on
        return True
    return False

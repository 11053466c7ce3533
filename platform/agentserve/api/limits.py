"""Size limits on the request fields an engine works through at every step, and on the
structured-output constraints a replica compiles: one place for the numbers.

Why: vLLM checks every stop string after each detokenizer update, in the output processor
that all requests of a replica share; `bad_words` runs a Python loop per step in the
sampler; token-id lists and logit_bias become per-step tensors; a grammar, regex or
structural tag is compiled (xgrammar) on the replica's cores. One request with 900k stop
strings, or a 3 MiB grammar, slows every tenant on that replica. So the ingress refuses,
with a 400 naming the field and the limit, before anything is queued:

  stop                   at most MAX_STOP strings (OpenAI's limit) of at most
                         MAX_STOP_CHARS characters each
  bad_words              at most MAX_BAD_WORDS strings of at most MAX_STOP_CHARS each
  stop_token_ids,        at most MAX_TOKEN_IDS ids each
  allowed_token_ids
  logit_bias             at most MAX_LOGIT_BIAS entries (OpenAI's limit)
  structured_outputs     grammar, structural_tag: at most MAX_GRAMMAR_CHARS characters;
                         regex, whitespace_pattern: at most MAX_REGEX_CHARS; choice: at
                         most MAX_CHOICE_OPTIONS options of at most MAX_STOP_CHARS each;
                         json: a JSON Schema, checked and counted with the tool and
                         response_format schemas (api/validate.py check_schemas); as
                         JSON text at most MAX_SCHEMA_BYTES characters (refused before
                         it is decoded)
  response_format        structural_tag: at most MAX_GRAMMAR_CHARS as compact JSON; its
                         structures' schemas are checked like the others

Requests with any structured-output constraint are validated on the worker threads, on
their tenant's turns (admission/parsing.py, admission/fair_gate.py), like requests with schemas.
Every check here is O(limit) on the decoded body: cheap enough for the event loop.
`check_schema_bytes` (the schemas' total size as compact JSON, O(schemas)) is what the
child process that decodes large bodies runs (api/body_check.py), so a body of 3 MiB of
schema never comes back into the ingress's process to be sized there.
"""

from __future__ import annotations

import json
from typing import Any

from agentserve.api.errors import InvalidRequestError

__all__ = [
    "MAX_BAD_WORDS",
    "MAX_CHOICE_OPTIONS",
    "MAX_GRAMMAR_CHARS",
    "MAX_LOGIT_BIAS",
    "MAX_REGEX_CHARS",
    "MAX_SCHEMA_BYTES",
    "MAX_STOP",
    "MAX_STOP_CHARS",
    "MAX_TOKEN_IDS",
    "all_schemas",
    "check_list_limits",
    "check_schema_bytes",
    "check_structured_limits",
    "has_structured_outputs",
    "schemas_too_large",
    "structured_schemas",
]

MAX_STOP = 4  # stop sequences per request (OpenAI's limit; vLLM's VLLM_MAX_STOP_STRINGS)
MAX_STOP_CHARS = 256  # characters of one stop string, bad word or choice option
MAX_BAD_WORDS = 32
MAX_TOKEN_IDS = 1024  # each of stop_token_ids, allowed_token_ids
MAX_LOGIT_BIAS = 300  # logit_bias entries (OpenAI's limit)
MAX_GRAMMAR_CHARS = 32 * 1024  # an EBNF grammar or a structural tag
MAX_REGEX_CHARS = 4096
MAX_CHOICE_OPTIONS = 256
MAX_SCHEMA_BYTES = 256 * 1024  # all tool, response_format and structured schemas, compact
TOKEN_ID_FIELDS = ("stop_token_ids", "allowed_token_ids")
# structured_outputs constraints; `json` is a schema (structured_schemas), the rest text
STRUCTURED_TEXTS = (
    ("grammar", MAX_GRAMMAR_CHARS),
    ("structural_tag", MAX_GRAMMAR_CHARS),
    ("regex", MAX_REGEX_CHARS),
    ("whitespace_pattern", MAX_REGEX_CHARS),
)


def _too_many(param: str, count: int, limit: int, what: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"'{param}' has {count} {what}; at most {limit} are accepted per request.",
        param=param,
        code="too_many_items",
    )


def _too_long(param: str, chars: int, limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"'{param}' is {chars} characters long; at most {limit} are accepted.",
        param=param,
        code="value_too_long",
    )


def _check_strings(data: dict[str, Any], name: str, most: int, what: str, prefix: str = "") -> None:
    value, name = data.get(name), prefix + name
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return  # absent, or a type the protocol model refuses
    if len(value) > most:
        raise _too_many(name, len(value), most, what)
    for i, item in enumerate(value):
        if isinstance(item, str) and len(item) > MAX_STOP_CHARS:
            raise _too_long(f"{name}[{i}]", len(item), MAX_STOP_CHARS)


def check_list_limits(data: dict[str, Any]) -> None:
    """400 (code too_many_items / value_too_long) past the limits above on stop,
    bad_words, the token-id lists and logit_bias. Wrong types pass: the protocol model
    names them."""
    _check_strings(data, "stop", MAX_STOP, "stop sequences")
    _check_strings(data, "bad_words", MAX_BAD_WORDS, "bad words")
    for name in TOKEN_ID_FIELDS:
        ids = data.get(name)
        if isinstance(ids, list) and len(ids) > MAX_TOKEN_IDS:
            raise _too_many(name, len(ids), MAX_TOKEN_IDS, "token ids")
    bias = data.get("logit_bias")
    if isinstance(bias, dict) and len(bias) > MAX_LOGIT_BIAS:
        raise _too_many("logit_bias", len(bias), MAX_LOGIT_BIAS, "entries")


def has_structured_outputs(data: dict[str, Any]) -> bool:
    """Whether the body asks for a structured-output constraint the replica compiles:
    structured_outputs (any), or response_format structural_tag."""
    if data.get("structured_outputs") is not None:
        return True
    response_format = data.get("response_format")
    return isinstance(response_format, dict) and response_format.get("type") == "structural_tag"


def check_structured_limits(data: dict[str, Any]) -> None:
    """400 (code structured_output_too_large / too_many_items) past the limits above on
    structured_outputs and response_format structural_tag (O(their size))."""
    params = data.get("structured_outputs")
    if isinstance(params, dict):
        for name, most in STRUCTURED_TEXTS:
            text = params.get(name)
            if isinstance(text, str) and len(text) > most:
                raise _structured_too_large(f"structured_outputs.{name}", len(text), most)
        _check_strings(params, "choice", MAX_CHOICE_OPTIONS, "options", "structured_outputs.")
        schema = params.get("json")
        if isinstance(schema, str) and len(schema) > MAX_SCHEMA_BYTES:
            raise _structured_too_large("structured_outputs.json", len(schema), MAX_SCHEMA_BYTES)
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "structural_tag":
        size = len(json.dumps(response_format, separators=(",", ":"), default=str))
        if size > MAX_GRAMMAR_CHARS:
            raise _structured_too_large("response_format", size, MAX_GRAMMAR_CHARS)


def _structured_too_large(param: str, chars: int, limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"'{param}' is {chars} characters long; structured-output constraints of at most "
        f"{limit} characters are accepted (the replica compiles them).",
        param=param,
        code="structured_output_too_large",
    )


def structured_schemas(data: dict[str, Any]) -> list[tuple[Any, str, str]]:
    """(schema, param, what) of the JSON Schemas in structured-output constraints, for
    check_schemas: structured_outputs.json (an object, or JSON text: 400 when it is not
    JSON), and the structures of a legacy response_format structural_tag."""
    found: list[tuple[Any, str, str]] = []
    params = data.get("structured_outputs")
    if isinstance(params, dict) and params.get("json") is not None:
        schema = params["json"]
        if isinstance(schema, str):
            schema = _json_text(schema, "structured_outputs.json")
        found.append((schema, "structured_outputs.json", "structured_outputs"))
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "structural_tag":
        structures = response_format.get("structures")
        for i, item in enumerate(structures if isinstance(structures, list) else []):
            if isinstance(item, dict) and item.get("schema") is not None:
                param = f"response_format.structures[{i}].schema"
                found.append((item["schema"], param, "response_format"))
    return found


def _json_text(text: str, param: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidRequestError(
            f"'{param}' must be a JSON Schema (an object or its JSON text).", param=param
        ) from None


def all_schemas(data: dict[str, Any]) -> list[tuple[Any, str, str]]:
    """(schema, param, what) of every JSON Schema in a body: tool parameters,
    response_format json_schema, the structured-output ones (structured_schemas)."""
    found: list[tuple[Any, str, str]] = []
    tools = data.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("parameters") is not None:
            name = function.get("name")
            found.append(
                (function["parameters"], f"tools[{i}].function.parameters", f"tool {name!r}")
            )
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        if isinstance(spec, dict) and spec.get("schema") is not None:
            found.append((spec["schema"], "response_format.json_schema.schema", "response_format"))
    return found + structured_schemas(data)


def schemas_too_large(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The request's tool, response_format and structured-output schemas exceed "
        f"{MAX_SCHEMA_BYTES} bytes (as compact JSON) at '{param}'.",
        param=param,
        code="schemas_too_large",
    )


def check_schema_bytes(data: dict[str, Any]) -> None:
    """400 (schemas_too_large) when the body's schemas (all_schemas) exceed
    MAX_SCHEMA_BYTES as compact JSON; wrong types pass (check_schemas names them)."""
    total = 0
    for schema, param, _ in all_schemas(data):
        if isinstance(schema, dict):
            total += len(json.dumps(schema, separators=(",", ":"), default=str))
            if total > MAX_SCHEMA_BYTES:
                raise schemas_too_large(param)

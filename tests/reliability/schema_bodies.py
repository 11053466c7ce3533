"""The request bodies and keys of the tool-schema scenario (tests/reliability/
tool_schemas.py), apart so its client processes import nothing of the server."""

from __future__ import annotations

from typing import Any

__all__ = ["GOOD_BODY", "KEY_GOOD", "KEY_HOSTILE", "MODEL", "hostile_body"]

KEY_HOSTILE, KEY_GOOD = "sk-schema-hostile", "sk-schema-good"
MODEL = "m"


def _tool(tag: str, i: int, properties: int = 12) -> dict[str, Any]:
    props = {
        f"{tag}_{j}": {"type": "string", "description": f"field {j}", "enum": ["a", "b", "c"]}
        for j in range(properties)
    }
    parameters = {"type": "object", "properties": props, "required": [f"{tag}_0"]}
    return {"type": "function", "function": {"name": f"tool_{i}", "parameters": parameters}}


def hostile_body(n: int) -> dict[str, Any]:
    """128 tools, every schema new (tagged with `n`), the last one invalid."""
    tools = [_tool(f"h{n}x{i}", i) for i in range(127)]
    tools.append(
        {"type": "function", "function": {"name": "bad", "parameters": {"type": f"no{n}"}}}
    )
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": tools}


GOOD_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "look this up for me"}],
    "tools": [_tool("g", i) for i in range(8)],
    "max_tokens": 8,
}

"""Training prompts that carry text the answer reuses: real third-party Python code, tool
output and tool schemas, so a drafter learns to copy what the context already holds.

Sources are functions parsed (never imported) from installed third-party packages in an
allowlist. Never used: the Python standard library's source or docstrings, any copy of
them vendored inside a package (matched by docstring and by normalised source against an
index of the stdlib), and HumanEval; the packages in `HELDOUT_PACKAGES` are kept for
evaluation prompts built the same way (`heldout_context_prompts`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from dflash.train.prompts import Prompt

__all__ = [
    "HELDOUT_PACKAGES",
    "TRAINING_PACKAGES",
    "CodeSnippet",
    "StdlibIndex",
    "agent_prompts",
    "code_prompts",
    "collect_snippets",
    "heldout_context_prompts",
]

TRAINING_PACKAGES = (
    "numpy", "torch", "transformers", "vllm", "ray", "pydantic", "fastapi", "starlette",
    "httpx", "requests", "aiohttp", "huggingface_hub", "accelerate", "safetensors", "sympy",
    "networkx", "jinja2", "click", "rich", "openai", "uvicorn", "kubernetes", "opentelemetry",
    "prometheus_client", "tqdm", "pygments", "matplotlib", "lark", "sentry_sdk", "agents",
)  # fmt: skip
HELDOUT_PACKAGES = ("kopf", "jsonschema", "yaml", "attr", "cachetools", "dateutil")
"""Evaluation-only sources: no training prompt is built from them."""

_SKIP_DIRS = {"_vendor", "vendor", "_distutils", "backports", "_vendored", "__pycache__"}
_MIN_LINES, _MAX_LINES, _MAX_CHARS = 6, 45, 1800


@dataclass(frozen=True)
class CodeSnippet:
    package: str
    module: str  # dotted path inside the package
    name: str
    source: str  # the function's own text, dedented
    args: tuple[str, ...]
    doc: str | None


def _normalised(source: str) -> str:
    return hashlib.sha1(" ".join(source.split()).encode()).hexdigest()


def _functions(path: Path) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Each function in the file with its own text, dedented (decorators left out)."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
        return
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            yield node, textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))


class StdlibIndex:
    """Docstrings and normalised sources of every stdlib function: a snippet matching
    either is a (vendored) copy of the standard library and is never used."""

    def __init__(self, root: str | Path | None = None) -> None:
        root = Path(root or sysconfig.get_paths()["stdlib"])
        self.docs: set[str] = set()
        self.sources: set[str] = set()
        for path in root.rglob("*.py"):
            if "site-packages" in path.parts:
                continue
            for node, segment in _functions(path):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 30:
                    self.docs.add(doc.strip())
                self.sources.add(_normalised(segment))

    def contains(self, snippet: CodeSnippet) -> bool:
        return bool(snippet.doc and snippet.doc.strip() in self.docs) or (
            _normalised(snippet.source) in self.sources
        )


def _package_root(package: str) -> Path | None:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    if stdlib in root.resolve().parents and "site-packages" not in root.parts:
        return None  # a standard library package, never a source
    return root


def collect_snippets(
    packages: tuple[str, ...], stdlib: StdlibIndex, per_package: int = 400, seed: int = 0
) -> list[CodeSnippet]:
    """Up to `per_package` functions (6-45 lines) from each installed package, in a
    seeded order; stdlib copies and near-empty bodies skipped."""
    rng = random.Random(seed)
    out: list[CodeSnippet] = []
    for package in packages:
        root = _package_root(package)
        if root is None:
            continue
        files = sorted(p for p in root.rglob("*.py") if not _SKIP_DIRS & set(p.parts))
        rng.shuffle(files)
        found: list[CodeSnippet] = []
        for path in files:
            if len(found) >= per_package:
                break
            module = ".".join((package, *path.relative_to(root).with_suffix("").parts))
            for node, segment in _functions(path):
                lines = segment.count("\n") + 1
                if not _MIN_LINES <= lines <= _MAX_LINES or len(segment) > _MAX_CHARS:
                    continue
                snippet = CodeSnippet(
                    package,
                    module,
                    node.name,
                    segment,
                    tuple(a.arg for a in node.args.args),
                    ast.get_docstring(node),
                )
                if not stdlib.contains(snippet):
                    found.append(snippet)
                    break  # one function per file: more variety per package
        out += found
    return out


_TASKS = [
    "Explain what this function from `{module}` does, step by step.",
    "Add type hints to this function and return the full updated function.",
    "Write a docstring for this function and return the whole function with it.",
    "Write pytest unit tests for this function.",
    "Refactor this function for readability without changing its behaviour. Return the full code.",
    "Add comments to this function, then return the commented code.",
    "Rename the local variables in this function to clearer names and return the code.",
    "Rewrite this function so it raises a ValueError with a clear message on invalid input.",
]
_MUTATIONS = [
    (" < ", " <= "),
    (" + 1", " - 1"),
    (" == ", " != "),
    ("True", "False"),
    (" and ", " or "),
]


def _fence(code: str) -> str:
    return f"```python\n{code}\n```"


def _code_task(snippet: CodeSnippet, rng: random.Random) -> tuple[str, str]:
    """(kind, prompt text) for one snippet."""
    roll = rng.random()
    if roll < 0.25:
        lines = snippet.source.splitlines()
        keep = max(2, int(len(lines) * rng.uniform(0.3, 0.6)))
        head = "\n".join(lines[:keep])
        return "complete", f"Complete this Python function:\n\n{_fence(head)}"
    if roll < 0.4:
        for old, new in rng.sample(_MUTATIONS, len(_MUTATIONS)):
            if old in snippet.source:
                buggy = snippet.source.replace(old, new, 1)
                return "fix", (
                    "This function has a bug. Find it, explain it in one sentence, and return "
                    f"the corrected function.\n\n{_fence(buggy)}"
                )
    task = rng.choice(_TASKS).format(module=snippet.module)
    return "edit", f"{task}\n\n{_fence(snippet.source)}"


def code_prompts(snippets: list[CodeSnippet], n: int, seed: int = 0) -> list[Prompt]:
    """n prompts asking to complete / fix / explain / edit real functions."""
    rng = random.Random(seed)
    out: dict[str, Prompt] = {}
    for _ in range(n * 3):
        if len(out) >= n or not snippets:
            break
        snippet = rng.choice(snippets)
        kind, text = _code_task(snippet, rng)
        if text not in out:
            out[text] = Prompt(f"code-ctx-{len(out):06d}", f"code-{kind}", text)
    return list(out.values())


def _record(snippet: CodeSnippet) -> dict[str, object]:
    return {
        "name": snippet.name,
        "module": snippet.module,
        "args": list(snippet.args),
        "lines": snippet.source.count("\n") + 1,
        "summary": (snippet.doc or "").strip().split("\n")[0][:100] or None,
    }


def _tool_schema(snippet: CodeSnippet) -> dict[str, object]:
    args = [a for a in snippet.args if a not in ("self", "cls")]
    return {
        "name": snippet.name,
        "description": (snippet.doc or f"{snippet.module}.{snippet.name}").split("\n")[0][:120],
        "parameters": {
            "type": "object",
            "properties": {a: {"type": "string"} for a in args},
            "required": args[:1],
        },
    }


def _agent_messages(snippets: list[CodeSnippet], rng: random.Random) -> tuple[str, list[dict]]:
    """(kind, chat messages) of one agent-style exchange over real code metadata."""
    picked = rng.sample(snippets, min(len(snippets), rng.randint(3, 6)))
    records = json.dumps([_record(s) for s in picked], indent=1)
    roll = rng.random()
    if roll < 0.35:
        ask = rng.choice(
            [
                "Summarise these search results as a JSON object with keys `functions` (names) "
                "and `modules` (unique module paths).",
                "Which of these functions take more than one argument? Reply with a JSON list "
                "of their names.",
                "Write a short report of these results: one line per function with its module.",
            ]
        )
        user = f"The tool `search_code` returned:\n```json\n{records}\n```\n{ask}"
        return "agent-summary", [{"role": "user", "content": user}]
    if roll < 0.7:
        first = picked[0]
        return (
            "agent-multiturn",
            [
                {"role": "user", "content": "Find functions in the codebase that I can reuse."},
                {
                    "role": "assistant",
                    "content": '<tool_call>{"name": "search_code", "arguments": '
                    f'{{"query": "{first.name}"}}}}</tool_call>',
                },
                {"role": "user", "content": f"Tool result:\n```json\n{records}\n```"},
                {"role": "assistant", "content": f"I found {len(picked)} functions."},
                {
                    "role": "user",
                    "content": "Show me the code of `" + first.name + "` and explain "
                    f"its arguments.\n\n{_fence(first.source)}",
                },
            ],
        )
    tools = json.dumps([_tool_schema(s) for s in picked], indent=1)
    target = rng.choice(picked)
    system = (
        "You are an agent that can call these tools:\n<tools>\n"
        f"{tools}\n</tools>\nTo call a tool, reply with "
        '<tool_call>{"name": <tool name>, "arguments": {<arguments>}}</tool_call>.'
    )
    user = (
        f"Use `{target.name}` from `{target.module}` on the example input, then explain the result."
    )
    return "agent-toolcall", [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]


def agent_prompts(snippets: list[CodeSnippet], n: int, seed: int = 0) -> list[Prompt]:
    """n agent-style prompts: tool output to summarise as JSON, multi-turn exchanges that
    quote tool results and code, and tool-call generation from real tool schemas."""
    rng = random.Random(seed)
    out: dict[str, Prompt] = {}
    for _ in range(n * 3):
        if len(out) >= n or len(snippets) < 3:
            break
        kind, messages = _agent_messages(snippets, rng)
        key = json.dumps(messages)
        if key not in out:
            out[key] = Prompt(f"agent-{len(out):06d}", kind, messages[-1]["content"], messages=key)
    return list(out.values())


def heldout_context_prompts(n: int, seed: int = 10_000) -> list[Prompt]:
    """Evaluation prompts of the same kinds (half code tasks, half agent/tool prompts) built
    only from `HELDOUT_PACKAGES`, which no training prompt uses."""
    snippets = collect_snippets(HELDOUT_PACKAGES, StdlibIndex(), per_package=60, seed=seed)
    built = code_prompts(snippets, n // 2, seed=seed) + agent_prompts(snippets, n - n // 2, seed)
    return [
        Prompt(f"heldout-{p.id}", f"heldout-{p.source}", p.text, messages=p.messages) for p in built
    ]

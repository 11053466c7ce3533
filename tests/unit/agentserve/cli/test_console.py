"""Agent-mode detection and the two output styles of console.Console."""

from __future__ import annotations

import io
import json

import pytest
from agentserve.cli.console import Console, plain_output


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("environ", "tty", "plain"),
    [
        ({}, True, False),  # a person at a terminal
        ({}, False, True),  # piped or redirected
        ({"CLAUDECODE": "1"}, True, True),
        ({"CODEX_SANDBOX": "seatbelt"}, True, True),
        ({"AI_AGENT": "yes"}, True, True),
        ({"AI_AGENT": ""}, True, False),  # empty = unset
        ({"CLAUDECODE": "0"}, True, False),
        ({"AGENTSERVE_OUTPUT": "plain"}, True, True),  # forced either way
        ({"AGENTSERVE_OUTPUT": "human", "CLAUDECODE": "1"}, False, False),
    ],
)
def test_plain_output_detection(environ, tty, plain):
    stream = _Tty() if tty else io.StringIO()
    assert plain_output(environ, stream) is plain


def test_plain_console_prints_json_events_and_tsv_without_escapes():
    out, err = io.StringIO(), io.StringIO()
    console = Console(out, err, plain=True, environ={})
    console.say("for people only")
    console.status("spinning")
    console.event("ready", "ignored text", url="http://x", models=["m"])
    console.table(["a", "b"], [(1, None), ("x\ty", 0.123456)])
    console.error("boom")
    lines = out.getvalue().splitlines()
    assert json.loads(lines[0]) == {"event": "ready", "url": "http://x", "models": ["m"]}
    assert lines[1:] == ["a\tb", "1\t-", "x y\t0.1235"]
    assert err.getvalue() == "agentserve: error: boom\n"
    assert "\033" not in out.getvalue() + err.getvalue()


def test_human_console_styles_aligns_and_closes_the_status_line():
    out = io.StringIO()
    console = Console(out, io.StringIO(), plain=False, environ={})
    console.status("starting 3s")
    console.say("done")
    console.table(["name", "n"], [("long-name", 1)])
    text = out.getvalue()
    assert text.startswith("\r\033[2Kstarting 3s\ndone\n")
    assert "\033[1mname       n\033[0m\nlong-name  1\n" in text


def test_no_color_keeps_human_layout_without_escapes():
    out = io.StringIO()
    Console(out, io.StringIO(), plain=False, environ={"NO_COLOR": "1"}).say(
        Console(out, plain=False, environ={"NO_COLOR": "1"}).style("x", "bold")
    )
    assert out.getvalue() == "x\n"

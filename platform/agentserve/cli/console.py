"""Terminal output for every CLI command: one decision between human and plain (agent) output.

Plain mode is chosen when an automated agent runs the CLI (CLAUDECODE, CODEX_SANDBOX or
AI_AGENT set in the environment) or stdout is not a terminal. Plain output is machine
readable: one JSON object per line (records, events) or TSV (tables), no colour, no
carriage-return animation. AGENTSERVE_OUTPUT=plain|human overrides the detection.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

__all__ = ["AGENT_ENV_VARS", "Console", "plain_output"]

AGENT_ENV_VARS = ("CLAUDECODE", "CODEX_SANDBOX", "AI_AGENT")
_FALSE = ("", "0", "false", "no")
_STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


def plain_output(environ: Mapping[str, str] | None = None, stream: TextIO | None = None) -> bool:
    """True when output should be plain: forced, an agent's environment, or not a terminal."""
    env = os.environ if environ is None else environ
    forced = env.get("AGENTSERVE_OUTPUT", "").strip().lower()
    if forced in ("plain", "human"):
        return forced == "plain"
    if any(env.get(name, "").strip().lower() not in _FALSE for name in AGENT_ENV_VARS):
        return True
    out = sys.stdout if stream is None else stream
    isatty = getattr(out, "isatty", None)
    return not (isatty is not None and isatty())


class Console:
    """Writes a command's output to `out` (results) and `err` (diagnostics).

    Human mode: styled text, an updating status line. Plain mode: JSON lines on `out` for
    events and records, TSV for tables, errors as plain text on `err`.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
        *,
        plain: bool | None = None,
        environ: Mapping[str, str] | None = None,
    ):
        self.out = sys.stdout if out is None else out
        self.err = sys.stderr if err is None else err
        self.plain = plain_output(environ, self.out) if plain is None else plain
        env = os.environ if environ is None else environ
        self.colour = not self.plain and "NO_COLOR" not in env
        self._status_open = False

    # -- human text ------------------------------------------------------------------------
    def style(self, text: str, *styles: str) -> str:
        """`text` wrapped in ANSI styles (bold, dim, red, green, yellow, cyan) when colour is on."""
        if not self.colour or not styles:
            return text
        codes = ";".join(_STYLES[s] for s in styles)
        return f"\033[{codes}m{text}\033[0m"

    def say(self, text: str = "") -> None:
        """A line for people; dropped in plain mode (use `event` for anything machine-read)."""
        if not self.plain:
            self._end_status()
            print(text, file=self.out, flush=True)

    def status(self, text: str) -> None:
        """Human mode: rewrite one status line in place. Plain mode: nothing."""
        if self.plain:
            return
        print("\r\033[2K" + text, end="", file=self.out, flush=True)
        self._status_open = True

    def _end_status(self) -> None:
        if self._status_open:
            print(file=self.out, flush=True)
            self._status_open = False

    # -- machine records -------------------------------------------------------------------
    def event(self, kind: str, text: str | None = None, **fields: Any) -> None:
        """An event: plain mode prints {"event": kind, **fields}; human mode prints `text`."""
        if self.plain:
            self.record({"event": kind, **fields})
        elif text is not None:
            self.say(text)

    def record(self, data: Mapping[str, Any]) -> None:
        """One JSON object on one line (any mode)."""
        self._end_status()
        print(json.dumps(data, default=str), file=self.out, flush=True)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Plain: TSV with a header line. Human: space-aligned columns, header in bold."""
        self._end_status()
        cells = [[_cell(v) for v in row] for row in rows]
        if self.plain:
            for line in [list(header), *cells]:
                print("\t".join(c.replace("\t", " ") for c in line), file=self.out)
            self.out.flush()
            return
        widths = [max(len(r[i]) for r in [list(header), *cells]) for i in range(len(header))]
        head = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()
        print(self.style(head, "bold"), file=self.out)
        for row in cells:
            print(
                "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(),
                file=self.out,
            )
        self.out.flush()

    def error(self, text: str) -> None:
        """An error for people and agents alike, on `err`."""
        self._end_status()
        print(self.style(f"agentserve: error: {text}", "red"), file=self.err, flush=True)

    def warn(self, text: str) -> None:
        """A warning on `err` (plain text in plain mode)."""
        self._end_status()
        print(self.style(f"agentserve: warning: {text}", "yellow"), file=self.err, flush=True)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)

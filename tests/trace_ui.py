"""Phoenix's trace page in headless Chromium (for tests/e2e): the rendered span tree read
back from the DOM, and a screenshot.

Phoenix's UI is a single-page app, so the page is loaded with a virtual time budget that
lets its scripts fetch the trace and render before Chromium dumps the DOM or takes the
picture. The flags keep Chromium off the network (it otherwise hangs on refused
connections on a closed machine) and make it run as root in a container."""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

from phoenix_api import ancestry

RENDER_BUDGET_MS = 15_000
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--virtual-time-budget={RENDER_BUDGET_MS}",
]
_LEVEL = re.compile(r"--trace-tree-nesting-level:\s*(\d+)")


def trace_url(phoenix: str, trace_id: str) -> str:
    """Phoenix's own redirect to the trace's page in its project."""
    return f"{phoenix}/redirects/traces/{trace_id}"


def render(binary: str, url: str, png: Path, size: tuple[int, int], timeout_s: float = 180):
    """Load `url` once in headless Chromium (fresh profile): (the rendered DOM, the
    (width, height) of the screenshot it saved at `png`)."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        done = subprocess.run(
            [
                binary,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                "--dump-dom",
                f"--screenshot={png}",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    head = png.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise RuntimeError(f"{png} is not a PNG")
    return done.stdout, struct.unpack(">II", head[16:24])


class _SpanTree(HTMLParser):
    """(nesting level, span name) per node of Phoenix's span tree, in document order.

    Each node is a `span-node-wrap` element whose style sets `--trace-tree-nesting-level`;
    the span's name is the first text inside its `span-node__heading`."""

    def __init__(self):
        super().__init__()
        self.nodes: list[tuple[int, str]] = []
        self._level: int | None = None
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if "span-node-wrap" in classes:
            found = _LEVEL.search(attributes.get("style") or "")
            self._level = int(found.group(1)) if found else None
        elif "span-node__heading" in classes and self._level is not None:
            self._in_heading = True

    def handle_data(self, data):
        if self._in_heading and data.strip():
            self.nodes.append((self._level, data.strip()))
            self._level, self._in_heading = None, False


def rendered_paths(dom: str) -> Counter:
    """Every node of the rendered tree as its path of names from the root (a multiset)."""
    parser = _SpanTree()
    parser.feed(dom)
    paths: Counter = Counter()
    stack: list[str] = []
    for level, name in parser.nodes:
        if level > len(stack):
            raise ValueError(f"{name!r} at level {level} under {stack}: the tree skips a level")
        del stack[level:]
        stack.append(name)
        paths[tuple(stack)] += 1
    return paths


def api_paths(spans: list[dict]) -> Counter:
    """The same multiset from spans as Phoenix's REST API returns them (parent ids)."""
    by_id = {s["context"]["span_id"]: s for s in spans}
    return Counter(tuple(reversed([s["name"], *ancestry(s, by_id)])) for s in spans)

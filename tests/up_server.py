"""`agentserve up` as a subprocess, the way a user runs it (for tests/e2e and tests/integration)."""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest


def agentserve_cmd() -> list[str]:
    """The installed `agentserve` script beside this Python, else `python -m agentserve.cli`."""
    script = Path(sys.executable).with_name("agentserve")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agentserve.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class UpServer:
    """A running `agentserve up --port PORT ...` with stdout piped (plain mode: JSON lines).

    `events` gets each parsed stdout line (a non-JSON line fails the reader loudly) and
    None at EOF; `lines` keeps the raw lines; stderr goes to a file.
    """

    def __init__(self, args: list[str], workdir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = workdir / f"up-{self.port}.stderr"
        with self.stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen(
                [*agentserve_cmd(), "up", "--port", str(self.port), *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=workdir,
            )
        self.events: queue.Queue = queue.Queue()
        self.lines: list[str] = []
        self.ready: dict = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self.events.put(json.loads(line))
        self.events.put(None)

    def wait_for(self, kind: str, timeout_s: float) -> dict:
        """The next stdout event of `kind`; fails the test on timeout or exit."""
        while True:
            try:
                event = self.events.get(timeout=timeout_s)
            except queue.Empty:
                pytest.fail(f"no {kind!r} event in {timeout_s} s; stderr:\n{self.stderr()}")
            if event is None:
                pytest.fail(f"`up` exited ({self.proc.poll()}) before {kind!r}:\n{self.stderr()}")
            if event.get("event") == kind:
                return event

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def stop(self, timeout_s: float = 120) -> int:
        """SIGINT (like Ctrl-C), wait; SIGKILL only if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode

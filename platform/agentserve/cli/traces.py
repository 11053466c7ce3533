"""`agentserve traces` and `agentserve up --traces`: the Phoenix trace UI on this machine.

Phoenix (Arize, open source) takes OTLP over HTTP on its UI port (and gRPC on another)
and shows each trace as a tree. It lives in its own environment (install.sh --traces puts
it in <venv>/phoenix: it needs a newer FastAPI than vLLM allows), so it runs as a child
process: start -> poll GET /healthz -> print the UI URL and the OTLP endpoint -> Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from agentserve.cli.console import Console
from agentserve.cli.signals import StopSignals

__all__ = ["Phoenix", "add_parser", "add_trace_options", "phoenix_executable", "traces_for_up"]

READY_TIMEOUT_S = 120.0


class PhoenixNotInstalledError(LookupError):
    """No Phoenix executable was found."""


def phoenix_executable(environ: Mapping[str, str] | None = None) -> Path:
    """AGENTSERVE_PHOENIX, else <this venv>/phoenix/bin/phoenix, else `phoenix` on PATH."""
    environ = os.environ if environ is None else environ
    candidates = [
        environ.get("AGENTSERVE_PHOENIX"),
        str(Path(sys.prefix) / "phoenix" / "bin" / "phoenix"),
        shutil.which("phoenix"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise PhoenixNotInstalledError(
        "the Phoenix trace UI is not installed: run ./install.sh --traces (it goes into "
        f"{Path(sys.prefix) / 'phoenix'}), or set AGENTSERVE_PHOENIX to a `phoenix` executable"
    )


def default_working_dir() -> Path:
    """Where Phoenix keeps its database: PHOENIX_WORKING_DIR, else our user data dir."""
    from platformdirs import user_data_dir

    return Path(
        os.environ.get("PHOENIX_WORKING_DIR") or Path(user_data_dir("agentserve")) / "phoenix"
    )


class Phoenix:
    """One Phoenix server process. `url` is both the UI and the OTLP/HTTP endpoint base."""

    def __init__(self, host: str = "127.0.0.1", port: int = 6006, grpc_port: int = 4317):
        self.host, self.port, self.grpc_port = host, port, grpc_port
        self.url = f"http://{host}:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self, working_dir: Path, log_path: Path) -> None:
        """Start `phoenix serve` in the background, its output going to `log_path`."""
        working_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PHOENIX_HOST": self.host,
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_WORKING_DIR": str(working_dir),
        }
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(phoenix_executable()), "serve"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our Ctrl-C is handled here, not by Phoenix
            )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Poll /healthz until 200; False if the process exits or time runs out."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=2, trust_env=False).is_success:
                    return True
            time.sleep(0.5)
        return False

    def stop(self, timeout_s: float = 20.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL if it hangs)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_phoenix(args: argparse.Namespace, console: Console) -> Iterator[Phoenix]:
    """Start Phoenix for `args` (port, grpc_port), announce it, stop it on exit.

    Raises PhoenixNotInstalledError, or RuntimeError when it does not become ready.
    """
    phoenix = Phoenix(port=args.traces_port, grpc_port=args.traces_grpc_port)
    working_dir = default_working_dir()
    log_path = working_dir / "phoenix.log"
    console.event("traces_starting", f"starting the Phoenix trace UI on {phoenix.url} ...")
    phoenix.start(working_dir, log_path)
    try:
        if not phoenix.wait_ready():
            raise RuntimeError(f"Phoenix did not start; see {log_path}")
        console.event(
            "traces",
            f"traces   {phoenix.url}   (OTLP: OTEL_EXPORTER_OTLP_ENDPOINT={phoenix.url})",
            url=phoenix.url,
            otlp_endpoint=phoenix.url,
            otlp_grpc_endpoint=f"http://{phoenix.host}:{phoenix.grpc_port}",
            working_dir=str(working_dir),
        )
        yield phoenix
    finally:
        phoenix.stop()


@contextlib.contextmanager
def traces_for_up(args: argparse.Namespace, console: Console) -> Iterator[str | None]:
    """`up --traces`: Phoenix for the lifetime of `up`, and OTEL_EXPORTER_OTLP_ENDPOINT set
    for the Ray processes about to start (unless already set). Yields the UI URL or None."""
    if not getattr(args, "traces", False):
        yield None
        return
    with running_phoenix(args, console) as phoenix:
        os.environ.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.url)
        yield phoenix.url


def run_traces(args: argparse.Namespace, console: Console | None = None) -> int:
    """`agentserve traces`: serve Phoenix until Ctrl-C/SIGTERM. Exit 0, 1 (failed), 2."""
    console = console or Console()
    try:
        with StopSignals() as signals, running_phoenix(args, console) as phoenix:
            console.say("Ctrl-C stops it. Agent programs: agentserve.sdk.connect() exports there.")
            while not signals.stop.wait(1.0):
                if phoenix.proc is not None and phoenix.proc.poll() is not None:
                    console.error(f"Phoenix exited ({phoenix.proc.returncode})")
                    return 1
    except PhoenixNotInstalledError as err:
        console.error(str(err))
        return 2
    except RuntimeError as err:
        console.error(str(err))
        return 1
    console.event("stopped", "stopped")
    return 0


def add_trace_options(p: argparse.ArgumentParser, flag: bool = False) -> None:
    """--traces-port / --traces-grpc-port, shared by `traces` and `up`; `flag` adds
    `up`'s --traces."""
    if flag:
        p.add_argument(
            "--traces",
            action="store_true",
            help="also run the Phoenix trace UI and send the server's spans there",
        )
    p.add_argument(
        "--traces-port", type=int, default=6006, help="Phoenix UI + OTLP/HTTP port (default 6006)"
    )
    p.add_argument(
        "--traces-grpc-port", type=int, default=4317, help="Phoenix OTLP/gRPC port (default 4317)"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `traces` on the CLI's subparsers."""
    p = sub.add_parser(
        "traces",
        help="run the Phoenix trace UI locally (OTLP in; agent-to-engine trace trees)",
        description="Start Arize Phoenix on this machine, print its URL and OTLP endpoint, and "
        "keep it running until Ctrl-C. Point agentserve and agent programs at it with "
        "OTEL_EXPORTER_OTLP_ENDPOINT (or use `agentserve up --traces`).",
    )
    add_trace_options(p)
    p.set_defaults(handler=run_traces)

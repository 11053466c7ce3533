"""`agentserve up` refuses a spec whose local LoRA adapter path is wrong (exit 2, naming
the adapter) before Ray or any engine starts."""

from __future__ import annotations

import io
import socket

from agentserve.cli import build_parser
from agentserve.cli.console import Console
from agentserve.cli.up import run_up


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_missing_local_adapter_exits_2_naming_it(tmp_path):
    spec = tmp_path / "spec.yaml"
    missing = tmp_path / "no-such-adapter"
    spec.write_text(f"models:\n  - engine: fake\n    lora: {{adapters: {{sql: {missing}}}}}\n")
    err = io.StringIO()
    args = build_parser().parse_args(["up", "--spec", str(spec), "--port", str(_free_port())])
    code = run_up(args, Console(io.StringIO(), err, plain=True, environ={}))
    assert code == 2, err.getvalue()
    assert "lora.adapters.sql" in err.getvalue() and "is not a directory" in err.getvalue()

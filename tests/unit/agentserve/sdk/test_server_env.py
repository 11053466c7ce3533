"""Where clients find the server and key (agentserve.sdk.server_env), and that `agentserve chat`,
`agentserve status` and agentserve.sdk.connect() all resolve them so."""

from __future__ import annotations

import argparse

import pytest
from agentserve.cli import build_parser
from agentserve.cli.chat import client_settings
from agentserve.sdk.server_env import resolve_api_key, resolve_base_url, server_root

LOCAL = "http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(
    ("explicit", "environ", "value", "source", "noted"),
    [
        (None, {}, LOCAL, "default", False),
        ("http://h:1", {"AGENTSERVE_BASE_URL": "http://x/v1"}, "http://h:1/v1", "--url", False),
        (
            None,
            {"AGENTSERVE_BASE_URL": "http://a:1/v1/"},
            "http://a:1/v1",
            "AGENTSERVE_BASE_URL",
            0,
        ),
        (None, {"OPENAI_BASE_URL": "https://o/v1"}, "https://o/v1", "OPENAI_BASE_URL", False),
        (
            None,
            {"AGENTSERVE_BASE_URL": "http://a/v1", "OPENAI_BASE_URL": "http://o/v1"},
            "http://a/v1",
            "AGENTSERVE_BASE_URL",
            False,
        ),
        (None, {"AGENTSERVE_URL": "http://old:2"}, "http://old:2/v1", "AGENTSERVE_URL", True),
        (
            None,
            {"AGENTSERVE_URL": "http://old:2", "OPENAI_BASE_URL": "http://o/v1"},
            "http://o/v1",
            "OPENAI_BASE_URL",
            False,
        ),
        (None, {"OPENAI_BASE_URL": "  "}, LOCAL, "default", False),  # blank = unset
    ],
)
def test_base_url_order(explicit, environ, value, source, noted):
    resolved = resolve_base_url(explicit, environ)
    assert (resolved.value, resolved.source, resolved.note is not None) == (
        value,
        source,
        bool(noted),
    )


def test_server_root_drops_v1():
    assert server_root("http://h:1/v1/") == "http://h:1"
    assert server_root("http://h:1") == "http://h:1"


def test_api_key_order(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-file\n")
    env = {"AGENTSERVE_API_KEY": "sk-agentserve", "OPENAI_API_KEY": "sk-openai"}
    assert resolve_api_key("sk-flag", str(key_file), env).value == "sk-flag"
    assert resolve_api_key(None, str(key_file), env).value == "sk-file"
    assert resolve_api_key(None, None, env).value == "sk-agentserve"
    assert resolve_api_key(None, None, {"OPENAI_API_KEY": "sk-openai"}).source == "OPENAI_API_KEY"
    by_env_file = resolve_api_key(None, None, {"AGENTSERVE_API_KEY_FILE": str(key_file)})
    assert (by_env_file.value, by_env_file.source) == ("sk-file", "AGENTSERVE_API_KEY_FILE")
    assert resolve_api_key(None, None, {}).value is None


def test_key_file_errors_are_user_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_api_key(None, str(tmp_path / "missing"), {})
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    with pytest.raises(ValueError, match="empty"):
        resolve_api_key(None, str(empty), {})


def _chat_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["chat", *argv])


def test_chat_resolves_openai_variables(monkeypatch):
    for name in ("AGENTSERVE_BASE_URL", "AGENTSERVE_URL", "AGENTSERVE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gateway.test:9000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-openai-env")
    assert client_settings(_chat_args("hi")) == (
        "http://gateway.test:9000/v1",
        "sk-from-openai-env",
    )


def test_chat_key_from_file_and_open_mode(monkeypatch, tmp_path):
    for name in ("AGENTSERVE_BASE_URL", "OPENAI_BASE_URL", "AGENTSERVE_URL", "AGENTSERVE_API_KEY",
                 "OPENAI_API_KEY", "AGENTSERVE_API_KEY_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    assert client_settings(_chat_args()) == (LOCAL, "none")
    key_file = tmp_path / "key"
    key_file.write_text("sk-secret")
    assert client_settings(_chat_args("--api-key-file", str(key_file)))[1] == "sk-secret"


def test_status_reads_the_same_variables(monkeypatch):
    from agentserve.cli import status

    seen = {}

    def fake_fetch(url, api_key=None, admin_url=None):
        seen.update(url=url, key=api_key, admin=admin_url)
        raise status.ServerUnreachableError("stop here")

    monkeypatch.setattr(status, "fetch_report", fake_fetch)
    monkeypatch.delenv("AGENTSERVE_BASE_URL", raising=False)
    monkeypatch.delenv("AGENTSERVE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gateway.test:9000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-o")
    args = build_parser().parse_args(["status"])
    assert status.run_status(args) == 1
    assert seen == {
        "url": "http://gateway.test:9000",
        "key": "sk-o",
        "admin": "http://gateway.test:9000",
    }


def test_sdk_connect_reads_openai_variables(monkeypatch):
    from agentserve import sdk

    monkeypatch.delenv("AGENTSERVE_BASE_URL", raising=False)
    monkeypatch.delenv("AGENTSERVE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gateway.test:9000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-o")
    connection = sdk.connect(frameworks=False, set_global_provider=False)
    assert connection.base_url == "http://gateway.test:9000/v1"
    assert connection.client.api_key == "sk-o"

"""Where a client (`agentserve chat`, `agentserve status`, agentserve.sdk) finds the server
and its API key: one convention, the OpenAI SDK's, with agentserve's names first.

Base URL (the API root, with /v1): an explicit value (--url, connect(base_url=...)), else
$AGENTSERVE_BASE_URL, else $OPENAI_BASE_URL, else $AGENTSERVE_URL (deprecated: the server
root without /v1, which older CLIs read), else http://127.0.0.1:8000/v1. A value without
/v1 gets it appended, so a server root works everywhere too.

API key: an explicit value (--api-key: visible in process lists, prefer the rest), else the
file an explicit path names (--api-key-file), else $AGENTSERVE_API_KEY, else
$OPENAI_API_KEY, else the file $AGENTSERVE_API_KEY_FILE names (e.g. a mounted Secret),
else None (open mode). A key file holds the key alone; surrounding whitespace is dropped.
Everything here is pure but `read_key_file`; the environment is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_BASE_URL",
    "Resolved",
    "api_base_url",
    "resolve_api_key",
    "resolve_base_url",
    "server_root",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
BASE_URL_ENVS = ("AGENTSERVE_BASE_URL", "OPENAI_BASE_URL")
DEPRECATED_URL_ENV = "AGENTSERVE_URL"  # the server root without /v1 (CLI before 0.2)
API_KEY_ENVS = ("AGENTSERVE_API_KEY", "OPENAI_API_KEY")
API_KEY_FILE_ENV = "AGENTSERVE_API_KEY_FILE"


@dataclass(frozen=True)
class Resolved:
    """A resolved setting: its value and where it came from (a flag, a variable's name or
    "default"); `note` is a deprecation to show the user, or None."""

    value: str | None
    source: str
    note: str | None = None


def api_base_url(url: str) -> str:
    """The OpenAI base URL for a server URL: http://h:p and http://h:p/v1 -> http://h:p/v1."""
    url = url.strip().rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def server_root(url: str) -> str:
    """The server root of a base URL: http://h:p/v1 and http://h:p -> http://h:p."""
    return url.strip().rstrip("/").removesuffix("/v1")


def resolve_base_url(explicit: str | None, environ: Mapping[str, str]) -> Resolved:
    """The API base URL (ending in /v1) by the order in the module docstring."""
    if explicit:
        return Resolved(api_base_url(explicit), "--url")
    for name in BASE_URL_ENVS:
        if environ.get(name, "").strip():
            return Resolved(api_base_url(environ[name]), name)
    if environ.get(DEPRECATED_URL_ENV, "").strip():
        note = (
            f"${DEPRECATED_URL_ENV} is deprecated: set $AGENTSERVE_BASE_URL (with /v1) or "
            "$OPENAI_BASE_URL instead"
        )
        return Resolved(api_base_url(environ[DEPRECATED_URL_ENV]), DEPRECATED_URL_ENV, note)
    return Resolved(DEFAULT_BASE_URL, "default")


def resolve_api_key(
    explicit: str | None, key_file: str | None, environ: Mapping[str, str]
) -> Resolved:
    """The API key by the order in the module docstring (value None: no key).
    Raises FileNotFoundError for a key file that does not exist, ValueError for an empty one."""
    if explicit:
        return Resolved(explicit, "--api-key")
    if key_file:
        return Resolved(read_key_file(key_file), "--api-key-file")
    for name in API_KEY_ENVS:
        if environ.get(name, "").strip():
            return Resolved(environ[name].strip(), name)
    if environ.get(API_KEY_FILE_ENV, "").strip():
        return Resolved(read_key_file(environ[API_KEY_FILE_ENV]), API_KEY_FILE_ENV)
    return Resolved(None, "default")


def read_key_file(path: str) -> str:
    """The key a file holds (whitespace around it dropped)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"API key file {path!r} does not exist")
    key = file.read_text(encoding="utf-8").strip()
    if not key:
        raise ValueError(f"API key file {path!r} is empty")
    return key

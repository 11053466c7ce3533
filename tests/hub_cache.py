"""Write a Hugging Face hub cache entry exactly as huggingface_hub lays it out, for offline
tests of the real resolution code: <cache>/models--ORG--NAME/{blobs/<sha256>,
snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/<branch> = commit}."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["write_snapshot"]


def write_snapshot(
    cache: Path, repo_id: str, files: dict[str, str | bytes | dict], *, branch: str = "main"
) -> Path:
    """Cache `files` (name -> text, bytes, or a dict written as JSON) as `repo_id`'s
    snapshot at `branch`; the commit hash is derived from the content. Returns its dir."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    blobs = {}
    for name, content in files.items():
        if isinstance(content, dict):
            content = json.dumps(content)
        data = content if isinstance(content, bytes) else content.encode()
        blobs[name] = hashlib.sha256(data).hexdigest()
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / blobs[name]).write_bytes(data)
    commit = hashlib.sha1(json.dumps(blobs, sort_keys=True).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for name, blob in blobs.items():
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        depth = len(Path(name).parts) + 1  # snapshots/<commit>/<name...>
        os.symlink(os.path.join(*[".."] * depth, "blobs", blob), link)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)  # huggingface_hub writes no newline
    return snapshot

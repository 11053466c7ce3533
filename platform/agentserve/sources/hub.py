"""Hugging Face Hub sources: `org/name` ids resolved with huggingface_hub into its cache.

A replica calls `resolve_hub` before its engine starts. The first caller per cache
downloads (huggingface_hub's progress bars; HF_TOKEN for gated or private repos) under a
file lock in the cache, then marks the snapshot complete; later callers, and those that
waited on the lock, find the mark and touch no network. With HF_HUB_OFFLINE=1 only the
cache is read and a missing snapshot is a ModelNotFoundError naming the id. The cache is
huggingface_hub's own: $HF_HUB_CACHE, else $HF_HOME/hub (a PVC in the Helm chart).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from filelock import FileLock, Timeout
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from tqdm.auto import tqdm

from agentserve.sources.errors import ModelNotFoundError

__all__ = ["hub_cache_dir", "hub_offline", "resolve_hub"]

log = logging.getLogger(__name__)

# gpt-oss ships its weights twice more (original/ for its reference code, metal/ for Apple
# GPUs); vLLM reads only the top-level safetensors.
IGNORE_PATTERNS = ["original/*", "metal/*"]
LOCK_TIMEOUT_S = 6 * 3600.0  # another replica downloading a 120B model can take hours
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> Path:
    """huggingface_hub's cache, read from the environment now (not at its import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE is set to a true value (1, on, yes, true)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


class _Quiet(tqdm):
    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def resolve_hub(repo_id: str, revision: str | None = None, *, progress: bool = True) -> Path:
    """Local snapshot directory of `repo_id` at `revision` (branch, tag or commit; None =
    main), downloading it once into the cache unless HF_HUB_OFFLINE is set.

    Raises ModelNotFoundError (unknown or gated repo, unknown revision, not cached while
    offline, hub unreachable) with what to do about it.
    """
    cache = hub_cache_dir()
    state = cache / ".locks" / "agentserve"
    state.mkdir(parents=True, exist_ok=True)
    folder = constants.REPO_ID_SEPARATOR.join(["models", *repo_id.split("/")])
    where = f"{repo_id!r} (revision {revision or 'main'})"
    if hub_offline():
        return _cached(repo_id, revision, cache, where)
    lock = FileLock(str(state / f"{folder}.lock"))
    _acquire(lock, where)
    try:
        cached = _complete_snapshot(repo_id, revision, cache, state / folder)
        if cached is not None:
            return cached
        return _download(repo_id, revision, cache, state / folder, where, progress)
    finally:
        lock.release()


def _cached(repo_id: str, revision: str | None, cache: Path, where: str) -> Path:
    """The cached snapshot (offline), or ModelNotFoundError naming the id and the cache."""
    try:
        return Path(_snapshot(repo_id, revision, cache, local_files_only=True))
    except (LocalEntryNotFoundError, IncompleteSnapshotError) as err:
        raise ModelNotFoundError(
            f"model {where} is not in the Hugging Face cache {cache}, and HF_HUB_OFFLINE=1 "
            f"forbids downloading it: download it first (HF_HOME={cache.parent} hf download "
            f"{repo_id}) or unset HF_HUB_OFFLINE ({type(err).__name__})"
        ) from None


def _complete_snapshot(repo_id: str, revision: str | None, cache: Path, mark: Path) -> Path | None:
    """The cached snapshot when an earlier download here marked it complete, else None."""
    try:
        path = Path(_snapshot(repo_id, revision, cache, local_files_only=True))
    except (LocalEntryNotFoundError, IncompleteSnapshotError):
        return None
    return path if _mark_file(mark, path).is_file() else None


def _mark_file(mark: Path, snapshot: Path) -> Path:
    return mark.with_name(f"{mark.name}@{snapshot.name}.complete")  # snapshot name = commit


def _download(
    repo_id: str, revision: str | None, cache: Path, mark: Path, where: str, progress: bool
) -> Path:
    started = time.perf_counter()
    log.info("downloading %s from the Hugging Face Hub into %s", where, cache)
    try:
        path = Path(_snapshot(repo_id, revision, cache, progress=progress))
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"model {where}: no such revision on the Hub") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ModelNotFoundError(
            f"model {where}: repository not found or not accessible; check the id, and for a "
            "gated or private repository accept its terms and set HF_TOKEN"
        ) from None
    except (LocalEntryNotFoundError, IncompleteSnapshotError, HfHubHTTPError) as err:
        raise ModelNotFoundError(
            f"model {where}: cannot download from the Hugging Face Hub and not in the cache "
            f"{cache}: {err}"
        ) from None
    _mark_file(mark, path).write_text(f"{repo_id} {revision or 'main'}\n")
    log.info("downloaded %s in %.0f s: %s", where, time.perf_counter() - started, path)
    return path


def _snapshot(
    repo_id: str,
    revision: str | None,
    cache: Path,
    *,
    local_files_only: bool = False,
    progress: bool = True,
) -> str:
    return snapshot_download(
        repo_id,
        revision=revision,
        cache_dir=cache,
        local_files_only=local_files_only,
        ignore_patterns=IGNORE_PATTERNS,
        tqdm_class=None if progress else _Quiet,
    )


def _acquire(lock: FileLock, where: str) -> None:
    """Take `lock`, saying so when another process holds it (it is downloading)."""
    try:
        lock.acquire(timeout=0)
        return
    except Timeout:
        log.info("waiting for another process downloading %s (%s)", where, lock.lock_file)
    try:
        lock.acquire(timeout=LOCK_TIMEOUT_S)
    except Timeout as exc:
        raise ModelNotFoundError(
            f"gave up after {LOCK_TIMEOUT_S:.0f} s waiting for {lock.lock_file}, held by "
            f"another process downloading {where}"
        ) from exc

"""Download Hugging Face ids into the hub cache ($HF_HOME) before a model replica starts.

`python -m agentserve.sources.prefetch ORG/NAME[@REVISION] ...` is the init container of a model
replica pod on Kubernetes (agentserve_operator/pods.py): the multi-GB download runs there,
with its progress and failures in the pod's state and restarts with backoff, never inside
the Serve replica's constructor. It resolves each id exactly as the replica will
(agentserve.sources.hub.resolve_hub: one download per cache under a file lock, a completion mark),
so the replica then finds a complete snapshot and starts at once. Exit status: 0 when every
id is in the cache, 1 (naming the id) otherwise.
"""

from __future__ import annotations

import sys

__all__ = ["main", "parse_ref", "prefetch"]


def parse_ref(ref: str) -> tuple[str, str | None]:
    """`ORG/NAME@REVISION` -> (ORG/NAME, REVISION); no `@` -> revision None."""
    repo, sep, revision = ref.partition("@")
    if not repo or (sep and not revision):
        raise ValueError(f"not ORG/NAME[@REVISION]: {ref!r}")
    return repo, revision or None


def prefetch(refs: list[str]) -> list[str]:
    """Resolve every ref into the hub cache; the snapshot directories, in order."""
    from agentserve.sources.hub import resolve_hub

    return [str(resolve_hub(*parse_ref(ref), progress=False)) for ref in refs]


def main(argv: list[str] | None = None) -> int:
    refs = sys.argv[1:] if argv is None else argv
    if not refs:
        print(
            "usage: python -m agentserve.sources.prefetch ORG/NAME[@REVISION] ...", file=sys.stderr
        )
        return 2
    try:
        for ref, path in zip(refs, prefetch(refs), strict=True):
            print(f"{ref}: {path}", flush=True)
    except Exception as err:  # top level: report and exit non-zero (the pod retries)
        print(f"prefetch failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

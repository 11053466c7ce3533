"""`agentserve up`'s command-line options and their help (the command itself: up.py)."""

from __future__ import annotations

import argparse

from agentserve.cli.traces import add_trace_options
from agentserve.drafters import default_speculation
from agentserve.spec import BUNDLED_MODEL

__all__ = ["add_up_parser"]


def _default_method() -> str:
    """How the bundled model speculates by default on this kind of CPU, for --help."""
    from agentserve.drafters import has_served_speculation, machine_class

    machine = machine_class()
    if machine == "cuda":
        return "none on GPU (no figures measured there)"
    if not has_served_speculation(BUNDLED_MODEL, machine):
        return (
            "the method it picks from this machine's step costs, timed at the first start "
            "(no served figures for this kind of CPU)"
        )
    method = default_speculation(BUNDLED_MODEL)
    if method is None:
        return "none (nothing beat plain decoding through the server on this kind of CPU)"
    return f"{method}, measured fastest through the server on this kind of CPU"


def add_up_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `up` subparser with its options (the caller sets its handler)."""
    p = sub.add_parser(
        "up",
        help="serve models on local Ray with the OpenAI-compatible API (Ctrl-C stops)",
        description="Start local Ray + Ray Serve with a DeploymentSpec (default: the bundled "
        f"model {BUNDLED_MODEL}, or --model's, speculating with {_default_method()}; on the "
        "GPU where CUDA is visible) and serve the OpenAI-compatible API until Ctrl-C or "
        "SIGTERM.",
    )
    p.add_argument("--spec", help="DeploymentSpec YAML/JSON (default: the embedded deployment)")
    p.add_argument(
        "--model",
        metavar="HF_ID|PATH",
        help="serve this model instead of the bundled one: a Hugging Face id (downloaded once "
        "into the hub cache) or a local Hugging Face format directory; served as the id or "
        "the directory's name. With a GPU: its own dtype and context length, and its "
        "published DFlash drafter where the drafter catalog lists one",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float16", "float32"),
        help="every model's dtype (default: bfloat16 on CPU, auto on GPU)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        metavar="TOKENS",
        help="every model's context length (default: 2048 on CPU; on GPU the model's own, "
        "fitted to the GPU's memory)",
    )
    p.add_argument("--host", help="bind address (default: the spec's server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="API port (default: the spec's server.port, 8000)")
    p.add_argument(
        "--trusted-host",
        action="append",
        metavar="NAME",
        help="with no API keys, also answer requests whose Host is NAME (repeatable; "
        "localhost, 127.0.0.1 and ::1 always are): server.trusted_hosts",
    )
    p.add_argument(
        "--drafter",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="force speculative drafting on or off for every model, with each spec's "
        "drafter.method (default dflash) (default: the spec's setting; the bundled model "
        f"speculates with {_default_method()} unless the spec sets drafter.enabled)",
    )
    p.add_argument(
        "--speculation",
        choices=("dflash", "ngram", "hybrid", "suffix", "eagle3", "mtp", "none"),
        default=None,
        help="speculative decoding method for every model (default: the spec's drafter; "
        f"the bundled model speculates with {_default_method()}; docs/benchmarks.md). "
        "On GPU a model the drafter catalog lists speculates with its published DFlash "
        "drafter, others decode plainly; none turns speculation off. "
        "dflash uses drafter.path, the shipped or the catalog's DFlash drafter; ngram "
        "(prompt lookup) needs no drafter; hybrid drafts with n-gram where prompt lookup "
        "matches and with the DFlash drafter elsewhere; eagle3 needs drafter.path in the spec",
    )
    p.add_argument(
        "--start-timeout-s",
        type=float,
        default=900.0,
        help="give up when not ready after this many seconds (default: %(default)s)",
    )
    p.add_argument("--verbose", action="store_true", help="show Ray's, Serve's and vLLM's own logs")
    add_trace_options(p, flag=True)  # --traces, --traces-port, --traces-grpc-port
    return p

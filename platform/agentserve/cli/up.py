"""`agentserve up`: serve a DeploymentSpec on local Ray until Ctrl-C or SIGTERM.

Order: load spec (--spec, or --model's deployment; + --dtype/--max-model-len, --host/--port,
device and drafter defaults) -> check drafters and port -> prepare model weights (then the
context length of a GPU model downloaded just now) -> start Ray + Serve -> poll until every
deployment is healthy and /health answers -> print URL and examples -> wait for a signal ->
serve.shutdown, ray.shutdown.
Exit codes: 0 stopped cleanly, 1 failed to start, 2 invalid input (spec, port, drafter).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator

from agentserve.cli.console import Console
from agentserve.cli.signals import StopSignals
from agentserve.cli.traces import (
    PhoenixNotInstalledError,
    phoenix_executable,
    traces_for_up,
)
from agentserve.cli.up_args import add_up_parser
from agentserve.engine.cpu_info import read_cpu_info
from agentserve.engine.start_phases import (
    current_phase,
    describe_phases,
    log_phases,
    session_log_text,
)
from agentserve.engine.vllm_args import DrafterMissingError, speculative_config
from agentserve.serve import local
from agentserve.serve.local import admin_url, current_app_state, readiness
from agentserve.serve.names import deployment_name
from agentserve.serve.ready import wait_ready
from agentserve.sources.adapters import AdapterMissingError, check_local_adapters
from agentserve.sources.models import resolve_model
from agentserve.spec import DeploymentSpec, SpecError, load_spec
from agentserve.spec.defaults import resolve_drafters
from agentserve.spec.device_defaults import with_context_lengths
from agentserve.spec.overrides import (
    spec_for_model,
    with_engine_settings,
    with_overrides,
    with_speculation,
)
from agentserve.speculation.calibration import export_decisions

__all__ = ["add_parser", "run_up"]
# with_overrides, with_speculation (spec/overrides.py) and admin_url (serve/local.py) are
# imported here for `up` itself; other callers import them from their modules.

POLL_S = 1.0
PLAIN_PROGRESS_EVERY_S = 10.0
CPU_ENGINE_HINT = "vLLM on CPU: a first start compiles, about 2 min; later starts load the cache"


class PortInUseError(OSError):
    """The API address is already taken."""


# -- spec preparation (pure) -------------------------------------------------------------------
def check_drafters(spec: DeploymentSpec) -> dict[str, str | None]:
    """model name -> drafter directory (None = no drafting); raises DrafterMissingError."""
    found = {}
    for model in spec.models:
        config = speculative_config(model)
        if config is None:
            found[model.name] = None
        else:  # "dflash /path/to/drafter", "hybrid /path/to/drafter", "ngram"
            method = model.drafter.method  # hybrid runs vLLM's "dflash" (vllm_args)
            found[model.name] = " ".join(filter(None, (method, config.get("model"))))
    return found


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUseError when something listens on host:port (bind test, like uvicorn)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as err:
            raise PortInUseError(
                f"cannot serve on {host}:{port}: {err.strerror or err}; stop what uses it "
                "(`agentserve status --url ...` tells whether it is agentserve) or pass --port N"
            ) from None


def base_spec(args: argparse.Namespace) -> DeploymentSpec:
    """The spec `up` starts from: --spec's file, else --model's deployment (default: the
    bundled model), with --dtype/--max-model-len; SpecError for --spec with --model."""
    model = getattr(args, "model", None)
    if model is not None and args.spec:
        raise SpecError("--model and --spec: choose one (a spec file names its own models)")
    spec = load_spec(args.spec) if args.spec else spec_for_model(model)
    return with_engine_settings(
        spec, getattr(args, "dtype", None), getattr(args, "max_model_len", None)
    )


def load_up_spec(
    args: argparse.Namespace, console: Console | None = None
) -> tuple[DeploymentSpec, list[str]]:
    """The spec `up` serves: base_spec, flags applied, device and drafter defaults decided
    (and exported for the metrics: calibration.export_decisions)."""
    spec = base_spec(args)
    spec = with_speculation(spec, getattr(args, "speculation", None))
    decisions: dict[str, dict] = {}
    progress = None
    if console is not None:
        progress = lambda text: console.event("calibrating", text)  # noqa: E731
    spec, notes = resolve_drafters(spec, args.drafter, progress=progress, decisions=decisions)
    export_decisions(decisions)
    return with_overrides(spec, args.host, args.port, args.trusted_host), notes


# -- the command -------------------------------------------------------------------------------
def run_up(args: argparse.Namespace, console: Console | None = None) -> int:
    """`agentserve up`; see the module docstring for the order and exit codes."""
    console = console or Console()
    try:
        # what fails fast, first: the ports and the trace UI, before the default
        # speculation converts and times the model on a CPU without served figures
        plain = base_spec(args)
        server = with_overrides(plain, args.host, args.port, args.trusted_host).server
        check_port_free(server.host, server.port)
        if server.metrics_port is not None:
            check_port_free(server.host, server.metrics_port)
        if getattr(args, "traces", False):
            phoenix_executable()  # fail now, not after the weights are prepared
        spec, notes = load_up_spec(args, console)
        drafters = check_drafters(spec)
        check_local_adapters(spec)  # a wrong lora path: refused before Ray starts
    except (
        SpecError,
        DrafterMissingError,
        AdapterMissingError,
        PortInUseError,
        PhoenixNotInstalledError,
    ) as err:
        console.error(str(err))
        return 2
    for note in notes:
        console.warn(note)
    prepare_models(spec, console)
    spec, more = with_context_lengths(spec)  # a GPU model's config, downloaded just now
    notes += more
    for note in more:
        console.warn(note)
    try:
        # Ray prints task errors and worker lines on sys.stdout; keep stdout for our output.
        with (
            StopSignals() as signals,
            traces_for_up(args, console),  # --traces: Phoenix, and OTLP env for Ray's workers
            contextlib.redirect_stdout(sys.stderr),
        ):
            return _serve(spec, drafters, args, console, signals, notes)
    except PhoenixNotInstalledError as err:
        console.error(str(err))
        return 2


def prepare_models(spec: DeploymentSpec, console: Console) -> None:
    """Convert/cache each vLLM model's weights here, with progress, before Ray starts."""
    for model in spec.models:
        if model.engine != "vllm":
            continue
        console.event(
            "model",
            f"preparing weights for {model.name} ({model.source})",
            model=model.name,
            source=model.source,
        )
        path = resolve_model(model.source, revision=model.revision, progress=not console.plain)
        console.event("model_ready", f"  weights: {path}", model=model.name, path=str(path))


def _serve(
    spec: DeploymentSpec,
    drafters: dict[str, str | None],
    args: argparse.Namespace,
    console: Console,
    signals: StopSignals,
    notes: list[str],
) -> int:
    stop = signals.stop
    started = time.monotonic()
    console.event(
        "starting",
        f"starting Ray and Serve for {len(spec.models)} model(s) on "
        f"{spec.server.host}:{spec.server.port}",
        models=[m.name for m in spec.models],
        host=spec.server.host,
        port=spec.server.port,
    )
    try:
        try:
            local.start_local(spec, verbose=args.verbose)
            signals.install()  # take SIGTERM back from Ray's core
        except Exception as err:  # Ray's start failures are varied; report, then clean up
            console.error(f"Ray Serve failed to start: {type(err).__name__}: {err}")
            return 1
        ok = _wait_ready(spec, console, stop, started, args.start_timeout_s)
        if ok:
            _print_ready(spec, drafters, console, time.monotonic() - started, notes)
            _watch(console, stop)
        return 0 if ok or stop.is_set() else 1
    finally:
        console.event("stopping", "stopping: shutting down Serve and Ray ...")
        # Serve's shutdown makes Ray print expected "actor is dead" task errors: drop them
        quiet = contextlib.nullcontext() if args.verbose else _discard_stdout()
        with quiet:
            local.stop_local()
        console.event("stopped", "stopped")


def _wait_ready(
    spec: DeploymentSpec,
    console: Console,
    stop: threading.Event,
    started: float,
    timeout_s: float,
) -> bool:
    """Poll Serve and /health until ready (serve/ready.py), showing progress; False on
    failure, timeout or a stop signal."""
    uses_vllm = any(m.engine == "vllm" for m in spec.models)
    last_plain, phase = 0.0, None

    def progress(elapsed: float, text: str) -> None:
        nonlocal last_plain, phase
        if uses_vllm and "STARTING" in text:
            phase = current_phase(session_log_text())  # vLLM's own lines: where it is
            text += f"; engine: {phase or 'starting'} ({CPU_ENGINE_HINT})"
        console.status(f"  {_clock(elapsed)}  {text}")
        if console.plain and elapsed - last_plain >= PLAIN_PROGRESS_EVERY_S:
            last_plain = elapsed
            console.event("progress", elapsed_s=round(elapsed, 1), detail=text, phase=phase)

    outcome = wait_ready(
        local.base_url(spec),
        timeout_s=timeout_s,
        model_deployments={deployment_name(m.name): m.name for m in spec.models},
        stop=stop,
        on_progress=progress,
        poll_s=POLL_S,
        started=started,
    )
    if outcome.phase == "failed":
        console.error(f"the deployment failed to start:\n{outcome.detail}")
        console.say("(rerun with --verbose to see Ray's and vLLM's logs)")
    elif outcome.phase == "timeout":
        console.error(f"not ready after {timeout_s:.0f} s: {outcome.detail}")
    return outcome.phase == "ready"


def _watch(console: Console, stop: threading.Event, every_s: float = 5.0) -> None:
    """While serving: report when the app's health changes, until a stop signal."""
    last = "ready"
    while not stop.wait(every_s):
        try:
            state = readiness(current_app_state())
        except Exception as err:  # the controller may be briefly unreachable; keep serving
            console.warn(f"cannot read Serve status: {err}")
            continue
        if state.phase != last:
            last = state.phase
            console.event(
                "health",
                f"deployment is now {state.phase} {state.detail}".rstrip(),
                phase=state.phase,
                detail=state.detail,
            )


@contextlib.contextmanager
def _discard_stdout() -> Iterator[None]:
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        yield


# -- the ready banner --------------------------------------------------------------------------
def examples(base_url: str, model: str, needs_key: bool) -> dict[str, str]:
    """Ready-to-paste curl and openai-client snippets for `model` at `base_url` (pure)."""
    auth = ' \\\n  -H "Authorization: Bearer $AGENTSERVE_API_KEY"' if needs_key else ""
    key = 'os.environ["AGENTSERVE_API_KEY"]' if needs_key else '"none"'
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
    curl = (
        f"curl {base_url}/v1/chat/completions{auth} \\\n"
        f"  -H 'Content-Type: application/json' \\\n  -d '{body}'"
    )
    python = (
        f"{'import os' + chr(10) if needs_key else ''}from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base_url}/v1", api_key={key})\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{model}", messages=[{{"role": "user", "content": "Hello!"}}]\n'
        ")\n"
        "print(reply.choices[0].message.content)"
    )
    return {"curl": curl, "python": python}


def _print_ready(
    spec: DeploymentSpec,
    drafters: dict[str, str | None],
    console: Console,
    took_s: float,
    notes: list[str],
) -> None:
    base = local.base_url(spec)
    model = spec.models[0].name
    snippets = examples(base, model, needs_key=bool(spec.tenants))
    cpu = read_cpu_info()
    phases = log_phases(session_log_text()) if any(m.engine == "vllm" for m in spec.models) else {}
    if console.plain:
        console.event(
            "ready",
            phases=phases,
            url=base,
            base_url=f"{base}/v1",
            models=[m.name for m in spec.models],
            drafters=drafters,
            notes=notes,  # how each model's defaults were decided (device, drafter)
            took_s=round(took_s, 1),
            machine=cpu.as_dict(),
            **snippets,
        )
        return
    s = console.style
    took = describe_phases(phases)
    console.say(s(f"agentserve is up ({_clock(took_s)})", "bold", "green"))
    if took:
        console.say(f"  start    {took} (vLLM's own figures)")
    console.say(f"  API      {s(base + '/v1', 'cyan')}   (OpenAI-compatible)")
    console.say(f"  machine  {cpu.describe()}")
    for m in spec.models:
        drafter = drafters.get(m.name)
        spec_note = f"speculation {drafter}" if drafter else "no speculation"
        console.say(f"  model    {s(m.name, 'bold')}   ({spec_note})")
    admin = admin_url(spec)
    status = f"agentserve status --url {base}"
    status += f" --admin-url {admin}" if admin != base else ""
    console.say(f"  status   {status}     metrics {admin}/metrics")
    console.say(f"  chat     agentserve chat --url {base}")
    console.say("\n" + s("curl:", "bold"))
    console.say(snippets["curl"])
    console.say("\n" + s("Python (pip install openai):", "bold"))
    console.say(snippets["python"])
    console.say("\n" + s("Ctrl-C stops the server.", "dim"))


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `up` on the CLI's subparsers (its options: cli/up_args.py)."""
    add_up_parser(sub).set_defaults(handler=run_up)

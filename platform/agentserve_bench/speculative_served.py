"""`agentserve bench speculative-served`: speculation measured where users meet it, through
the HTTP API of the app `agentserve up` serves, the source of truth for the default method.

For each method (none first), a fresh `agentserve up` app (local Ray, Serve, ingress,
replica, vLLM) serves every workload at every concurrency; vLLM's own OpenAI server with
the same engine arguments and engine environment runs plain decoding too (and
`--peer-methods`), right after agentserve's run of the same method (`run_order`), so plain
agentserve is compared with what a user would run instead, in the same run and minutes
apart at most. Requests are greedy, streamed, `max_tokens` long unless the model stops.
Records (served_rows.row) replace the served rows of docs/benchmarks/speculative.json
(offline rows stay), and a table leads docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentserve.engine.cpu_info import read_cpu_info
from agentserve.engine.cpu_settings import engine_environment
from agentserve.engine.vllm_args import speculative_config
from agentserve.spec import DeploymentSpec

from agentserve_bench import process_cpu
from agentserve_bench.profile_write import (
    profile_dir,
    write_engine_profile,
    write_served_profiles,
)
from agentserve_bench.served_client import (
    level_figures,
    read_spec_counters,
    run_workload,
    workload_messages,
)
from agentserve_bench.served_report import write_served
from agentserve_bench.served_rows import (
    by_machine,
    drafter_digest,
    fill_ratios,
    row,
    rows_of_shipped_drafter,
    served_default,
)
from agentserve_bench.settings_bundles import SCHEDULE_OFF, SETTINGS, default_settings

__all__ = ["add_parser", "bench_spec", "parse_methods", "run", "run_order"]

SERVERS = ("agentserve", "vllm_serve")
WARM_REQUESTS = 2  # per server start, before any level is measured


def parse_methods(text: str) -> list[tuple[str, int]]:
    """'none,ngram:4,dflash:3' -> [("none", 0), ("ngram", 4), ("dflash", 3)]; "none" always
    first (every ratio is to it); k defaults to 4."""
    methods: list[tuple[str, int]] = [("none", 0)]
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, k = item.partition(":")
        if name == "none":
            continue
        if not k.isdigit() and k:
            raise SystemExit(f"--methods: bad k in {item!r} (METHOD[:k], k a positive integer)")
        methods.append((name, int(k or 4)))
    return methods


def run_order(
    methods: list[tuple[str, int]], peers: list[tuple[str, int]]
) -> list[tuple[str, str, int]]:
    """(server, method, k) in the order they run (pure): agentserve's methods in order, each
    vLLM-server peer right after agentserve's run of the same method (plain: second), the
    rest after them. Only neighbours in time are fair to compare on a shared machine whose
    speed drifts over minutes; with every peer last, plain agentserve and plain vLLM were
    measured 10 minutes apart."""
    order: list[tuple[str, str, int]] = []
    left = list(peers)
    for method, k in methods:
        order.append(("agentserve", method, k))
        if (method, k) in left:
            left.remove((method, k))
            order.append(("vllm_serve", method, k))
    return order + [("vllm_serve", m, k) for m, k in left]


def bench_spec(
    method: str,
    k: int,
    port: int,
    max_num_seqs: int,
    dtype: str | None,
    base: Any = None,
    engine: str = "vllm",
    drafter: str | None = None,
    schedule: str = "auto",
) -> DeploymentSpec:
    """The embedded deployment (or `base`) as `agentserve up --speculation METHOD` serves it,
    with k drafted tokens (per-batch schedule as `up` derives it), one replica, `port`.
    engine "fake" (pipeline tests) keeps the method as a label only; `drafter`: a DFlash
    drafter directory for dflash and hybrid (default: the shipped one); `schedule` "off":
    always k drafts, whatever the batch (what a drafter can do, not what `up` turns on)."""
    from agentserve.spec import spec_from_dict
    from agentserve.spec.defaults import resolve_drafters
    from agentserve.spec.overrides import with_overrides, with_speculation

    spec = with_speculation(base or DeploymentSpec(), method)
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["models"] = [m.model_dump(mode="json", exclude_unset=True) for m in spec.models[:1]]
    model = data["models"][0]
    model["max_num_seqs"] = max(max_num_seqs, spec.models[0].engine_slots)
    model["replicas"] = {"min_replicas": 1, "max_replicas": 1}
    if engine == "fake":
        model.update(engine="fake", drafter={"enabled": False})
        model["replicas"]["num_cpus"] = 0.5
    if dtype:
        model["dtype"] = dtype
    if method != "none" and engine == "vllm":
        model.setdefault("drafter", {})["num_speculative_tokens"] = k
        if drafter and method in ("dflash", "hybrid"):
            model["drafter"]["path"] = str(Path(drafter).resolve())
        if schedule == "off":
            model["drafter"]["speculation_schedule"] = "off"
    spec, _ = resolve_drafters(spec_from_dict(data, source="(bench speculative-served)"))
    return with_overrides(spec, "127.0.0.1", port)


@contextlib.contextmanager
def _agentserve(spec: DeploymentSpec, timeout_s: float, factory: Any) -> Iterator[tuple[str, str]]:
    from agentserve.serve import local

    from agentserve_bench.overhead_phases import _wait_ready

    base = f"http://{spec.server.host}:{spec.server.port}"
    local.start_local(spec, engine_factory=factory)
    try:
        _wait_ready(base, timeout_s)
        yield base, local.admin_url(spec) + "/metrics"
    finally:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            local.stop_local()


@contextlib.contextmanager
def _vllm_serve(spec: DeploymentSpec, timeout_s: float, logs: Path) -> Iterator[tuple[str, str]]:
    from agentserve.sources.models import resolve_model

    from agentserve_bench.overhead_peers import vllm_server
    from agentserve_bench.overhead_phases import free_port

    model = spec.models[0]
    model_dir = str(resolve_model(model.source, progress=True))
    with vllm_server(model, model_dir, free_port(), timeout_s, logs / "vllm_serve.log") as base:
        yield base, base + "/metrics"


def _measure(
    server: str, method: str, k: int, spec: DeploymentSpec, args: argparse.Namespace,
    conversations: dict[str, list], machine: dict[str, Any], settings: str, logs: Path,
) -> list[dict[str, Any]]:  # fmt: skip
    """Start one server with one method, run every workload at every concurrency."""
    model = spec.models[0]
    if server == "agentserve":
        serving = _agentserve(spec, args.start_timeout_s, _engine_factory(args.engine, method))
    else:
        serving = _vllm_serve(spec, args.start_timeout_s, logs)
    records = []
    started = time.perf_counter()
    env = engine_environment()
    drafter = _drafter_digest(model)
    with serving as (base, metrics_url):
        took = time.perf_counter() - started
        print(f"  {server} {method}:{k} ({settings}) ready in {took:.0f} s", flush=True)
        # two requests: vLLM's server ran its first two at a fifth of its speed (lazy
        # compilation of the verify shapes), which one warm-up left inside the first level
        warm = next(iter(conversations.values()))[:WARM_REQUESTS]
        asyncio.run(run_workload(base, model.name, warm, 1, args.max_tokens))
        for (workload, half), convs in conversations.items():
            for temperature, c in itertools.product(args.temperatures, args.concurrency):
                before = read_spec_counters(metrics_url)
                cpu_before = process_cpu.snapshot()
                replies, wall = asyncio.run(
                    run_workload(
                        base, model.name, convs, c, args.max_tokens, temperature=temperature
                    )
                )
                cpu_s = process_cpu.cpu_by_role(cpu_before, process_cpu.snapshot())
                time.sleep(args.metrics_settle_s)  # replica stats reach /metrics periodically
                after = read_spec_counters(metrics_url)
                counters = {key: after[key] - before.get(key, 0.0) for key in after}
                figures = level_figures(replies, wall)
                records.append(row(
                    server=server, method=method, k=k, workload=workload, concurrency=c,
                    figures=figures, counters=counters, machine=machine, dtype=model.dtype,
                    engine_env=env, texts=[r.text for r in replies], settings=settings,
                    drafter=drafter, schedule=model.drafter.num_speculative_tokens_per_batch_size,
                    half=half, speculative_config=speculative_config(model),
                    temperature=temperature, cpu_s_by_role=cpu_s,
                ))  # fmt: skip
                tau = records[-1]["tau"]
                print(
                    f"    {workload:7s} {half:6s} T={temperature:g} c={c}: "
                    f"{figures['decode_tokens_per_s']} tok/s "
                    f"decode, {figures['throughput_tokens_per_s']} tok/s aggregate, "
                    f"TTFT p50 {figures['ttft_ms_p50']} ms, tau {tau}",
                    flush=True,
                )
    return records


def _drafter_digest(model) -> str | None:
    """The digest of the DFlash drafter a dflash or hybrid row is measured with."""
    from agentserve.drafters import shipped_drafter

    drafter = model.drafter
    if not drafter.enabled or drafter.method not in ("dflash", "hybrid"):
        return None
    path = Path(drafter.path) if drafter.path else shipped_drafter(model.source)
    return drafter_digest(path) if path is not None and path.is_dir() else None


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """These variables set while a server starts and runs (Ray's workers and vLLM's server
    inherit this process's environment when they start)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _engine_factory(engine: str, method: str) -> Any:
    """The replica's engine: vLLM, or the fake (pipeline tests: a method other than none
    emits two tokens per step, so the pipeline's ratios and rule have something to see)."""
    if engine == "fake":
        from agentserve_bench.fake_engine import FakeEngineFactory

        return FakeEngineFactory(token_delay_s=0.01, accept_per_step=1 if method == "none" else 2)
    from agentserve.serve.replica import default_engine_factory

    return default_engine_factory


def _best_k(scores: dict[str, dict[str, Any]], method: str) -> int | None:
    """The k the default method's best served rows drafted (None for plain decoding)."""
    return scores[method]["k"] if method in scores else None


def report_only(args: argparse.Namespace, cpu_class: str | None = None) -> int:
    """Re-derive the ratios, default flags and the docs section from the committed served
    rows (no measurement): after the default settings or the rule change. The section's
    header and the printed scores are `cpu_class`'s (default: the most recently measured
    kind of CPU)."""
    figures = Path(args.docs) / "benchmarks" / "speculative.json"
    served = [r for r in json.loads(figures.read_text()) if r.get("path") == "served"]
    records: list[dict[str, Any]] = []
    for rows in by_machine(served).values():  # each kind of CPU decides from its own rows
        # ... and from the shipped drafter's dflash/hybrid rows, not a predecessor's
        default, scores = served_default(fill_ratios(rows_of_shipped_drafter(rows), None))
        records += fill_ratios(rows, default, _best_k(scores, default))
    # the section's header and scores: the most recently measured machine
    latest = max(
        (r for r in records if cpu_class in (None, r["machine"].get("cpu_class"))),
        key=lambda r: r.get("date", ""),
    )["machine"]
    default, scores = served_default(
        rows_of_shipped_drafter(by_machine(records)[latest["cpu_class"]])
    )
    commands = " ; ".join(sorted({r["command"] for r in records}))
    out = write_served(
        records, scores, default, Path(args.docs), command=commands, wall_s=0.0,
        machine=latest,
    )  # fmt: skip
    out += _write_profiles(Path(args.docs), records)
    print(f"default by the served rule: {default}; scores {scores}")
    print(f"written: {', '.join(map(str, out))}")
    return 0


def _write_profiles(docs: Path, records: list[dict[str, Any]], machines=None) -> list[Path]:
    """The profiles' speculation and acceptance sections from the served rows (every kind
    of machine's, or the `machines` given): a re-measure updates the profile, not code."""
    directory = profile_dir(docs)
    if directory is None:
        return []
    return write_served_profiles(rows_of_shipped_drafter(records), machines, directory)


def run(args: argparse.Namespace) -> int:
    if args.report_only:
        return report_only(args)
    methods = parse_methods(args.methods)
    peers = parse_methods(args.peer_methods) if args.peer_methods != "" else []
    if args.engine != "vllm" and peers:
        raise SystemExit("--peer-methods needs --engine vllm (pass --peer-methods '')")
    args.settings = args.settings or [default_settings()]
    unknown = [name for name in args.settings if name not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    machine = read_cpu_info().as_dict()
    started = time.perf_counter()
    print(f"machine: {read_cpu_info().describe()}", flush=True)
    conversations = {
        (w, half): workload_messages(w, args.num_prompts, half=half)
        for w in args.workloads
        for half in args.halves
    }
    port = args.port
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-served-") as logs:
        plan = run_order(methods, peers)
        for settings, dtype in itertools.product(args.settings, args.dtypes):
            # a dtype other than the spec's is a settings variant: its own ratios, no default
            label = settings if dtype is None else f"{settings}/{dtype}"
            label += SCHEDULE_OFF if args.schedule == "off" else ""  # a variant too
            for server, method, k in plan:
                spec = bench_spec(
                    method, k, port, max(args.concurrency), dtype, engine=args.engine,
                    drafter=args.drafter, schedule=args.schedule,
                )  # fmt: skip
                with _environment(SETTINGS[settings]):
                    records += _measure(
                        server, method, k, spec, args, conversations, machine, label,
                        Path(logs),
                    )  # fmt: skip
    default, scores = served_default(fill_ratios(records, None))
    records = fill_ratios(records, default, _best_k(scores, default))
    command = "agentserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    measured = {(r["server"], r["settings"]) for r in records}

    def keep(r: dict[str, Any]) -> bool:
        """Another kind of CPU's rows always stay; this kind's as --keep-other-rows says."""
        if r.get("machine", {}).get("cpu_class") != machine["cpu_class"]:
            return True
        return args.keep_other_rows and (r.get("server"), r.get("settings")) not in measured

    out = write_served(
        records, scores, default, Path(args.docs), command=command,
        wall_s=time.perf_counter() - started, machine=machine, keep_served=keep,
    )  # fmt: skip
    directory = profile_dir(Path(args.docs))
    engine = directory and write_engine_profile(machine["cpu_class"], records, command, directory)
    out += [engine] if engine else []  # a run comparing settings bundles: the fastest
    if args.keep_other_rows:  # the default and its flags from every row of this kind of CPU,
        print(f"this run's rows alone: default {default}; scores {scores}")  # not these alone
        return report_only(args, machine["cpu_class"])
    figures = Path(args.docs) / "benchmarks" / "speculative.json"
    every = json.loads(figures.read_text())  # the pooled fits read every kind's rows
    out += _write_profiles(Path(args.docs), every, {machine["cpu_class"]})
    print(f"default by the served rule: {default}; scores {scores}")
    print(f"written: {', '.join(map(str, out))}")
    return 0


def add_parser(kinds: argparse._SubParsersAction) -> None:
    from agentserve_bench.served_args import add_arguments

    p = kinds.add_parser(
        "speculative-served",
        help="speculation through the served HTTP API (agentserve up and vLLM's server): "
        "decode tokens/s, TTFT, tau, greedy texts vs plain; picks the default method",
        description="Starts the app `agentserve up` serves once per method, and vLLM's own "
        "server for plain decoding, with the same engine arguments and environment; sends "
        "held-out coding and agent conversations (never HumanEval or the standard library) at "
        "each concurrency; writes the served rows of docs/benchmarks/speculative.json and the "
        "served table at the top of docs/benchmarks.md. Run it with nothing else on the "
        "machine: the ratios are only as good as the quiet.",
    )
    add_arguments(p)
    p.set_defaults(handler=run)

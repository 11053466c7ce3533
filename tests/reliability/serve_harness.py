"""Local Ray Serve harness for the fault scenarios: start Serve, deploy a spec with the fake
engine, find/kill replica actors, read process memory, and stream requests as a client.

Requests are checked against what an undisturbed FakeEngine answers (`expected`), so a
stream that was cut, duplicated or continued wrongly counts as lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentserve.engine.protocol import EngineRequest
from agentserve.serve.replica import ModelReplica
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine

__all__ = ["Result", "deployed", "expected", "local_serve", "replica_names", "send_all"]

APP = "faults"
MODEL = "m"


@contextmanager
def local_serve(port: int) -> Iterator[str]:
    """Ray + Serve on 127.0.0.1:`port` (reused when Ray is already up, e.g. in a test
    module; then left running); yields the base URL."""
    import ray
    from ray import serve

    owned = not ray.is_initialized()
    if owned:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        if owned:
            serve.shutdown()
            ray.shutdown()


def spec_for(count: int, **overrides: Any) -> Any:
    """A one-model fake deployment: `count` fixed replicas, spec sections overridden per
    key ("replicas", "server", "model", "autoscaling")."""

    model = {"name": MODEL, "engine": "fake", "max_model_len": 512, "max_num_seqs": 16}
    model |= overrides.get("model", {})
    model["replicas"] = {
        "min_replicas": count,
        "max_replicas": count,
        "num_cpus": 0.1,
        **overrides.get("replicas", {}),
    }
    server = {"max_queue_len": 256, **overrides.get("server", {})}
    autoscaling = overrides.get("autoscaling", {})
    return DeploymentSpec.model_validate(
        {"models": [model], "server": server, "autoscaling": autoscaling}
    )


def deploy(app: Any, *, wait: bool = True) -> None:
    """Deploy (or update) the bound Serve application `app` as APP at route "/"; `wait`
    until it is running."""
    from ray import serve

    if wait:
        serve.run(app, name=APP, route_prefix="/")
    else:
        serve._run(app, name=APP, route_prefix="/", _blocking=False)


@contextmanager
def deployed(
    spec: Any, engine_factory: Any, num_replicas: int | None = None, ready_s: float = 60.0
) -> Iterator[None]:
    """APP deployed from `spec` (model replicas fixed at `num_replicas`, default the
    spec's) until exit, then deleted; entered once every replica runs (within `ready_s`)."""
    from ray import serve

    deploy(app_for(spec, engine_factory, num_replicas))
    replicas = spec.models[0].replicas
    want = num_replicas or replicas.initial_replicas or replicas.max_replicas
    running = lambda: running_replicas() == want and len(replica_names()) == want  # noqa: E731
    if wait_for(running, ready_s) is None:
        serve.delete(APP)
        raise RuntimeError(f"{want} replicas were not running within {ready_s:.0f} s")
    try:
        yield
    finally:
        serve.delete(APP)


def app_for(spec: Any, engine_factory: Any, num_replicas: int | None = None) -> Any:
    """build_app(spec) with the model's num_replicas overridden: redeploying it with only
    another count is a pure scale (no replica restarts), as an autoscaler's decision is."""
    from agentserve.serve.app import (  # imports Ray: lazily
        Ingress,
        deployment_options,
        ingress_options,
    )
    from ray import serve

    m = spec.models[0]
    options = deployment_options(m, spec)
    if num_replicas is not None:
        options = {k: v for k, v in options.items() if k != "autoscaling_config"}
        options["num_replicas"] = num_replicas
    window_s = spec.autoscaling.look_back_period_s
    model = (
        serve.deployment(ModelReplica)
        .options(**options)
        .bind(m, engine_factory, tracing=spec.tracing, window_s=window_s)
    )
    return serve.deployment(Ingress).options(**ingress_options(spec)).bind(spec, {m.name: model})


def deployment() -> str:
    from agentserve.serve.app import deployment_name

    return deployment_name(MODEL)


def replica_names() -> set[str]:
    """Names of the model's live replica actors."""
    import ray

    prefix = f"SERVE_REPLICA::{APP}#{deployment()}#"
    return {
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    }  # fmt: skip


def ongoing_requests(names: list[str]) -> dict[str, int]:
    """Requests each replica actor is serving now (Serve's own replica queue length), asked
    of all replicas at once so one slow answer does not age the others'."""
    import ray

    refs = [
        ray.get_actor(name, namespace="serve").get_num_ongoing_requests.remote() for name in names
    ]
    return dict(zip(names, (int(n) for n in ray.get(refs, timeout=10)), strict=True))


def busiest_replica(names: list[str], at_least: int, seen: dict[str, Any]) -> str | None:
    """One poll: the replica serving the most requests when it serves >= `at_least` (and
    seen["ongoing"]: every replica's count, busiest first), else None. A replica that
    answers past the poll's timeout (its event loop busy) is noted in seen["poll_errors"]
    and the poll returns None: poll again."""
    try:
        ongoing = ongoing_requests(names)
    except Exception as err:
        seen.setdefault("poll_errors", []).append(type(err).__name__)
        return None
    victim = max(names, key=ongoing.__getitem__)
    if ongoing[victim] < at_least:
        return None
    seen["ongoing"] = sorted(ongoing.values(), reverse=True)
    return victim


def replica_pid(name: str) -> int:
    """The process id of a replica actor (from Ray's actor table; no dashboard needed)."""
    import ray
    from ray._private.state import state

    actor = ray.get_actor(name, namespace="serve")
    return int(state.actor_table(actor._actor_id.hex())["Pid"])


def kill_replica(name: str) -> None:
    import ray

    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get(APP)
    if app is None or deployment() not in app.deployments:
        return 0
    return int(app.deployments[deployment()].replica_states.get("RUNNING", 0))


def wait_for(predicate: Any, timeout_s: float, step_s: float = 0.25) -> float | None:
    """Seconds until predicate() holds, or None after timeout_s."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(step_s)
    return None


def rss_mb(*titles: str) -> dict[str, float]:
    """Resident memory (MB) of the Ray worker processes whose command line contains each
    title (e.g. "ServeReplica:faults:ingress"); summed per title."""
    import psutil

    out = dict.fromkeys(titles, 0.0)
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        line = " ".join(proc.info["cmdline"] or ())
        for title in titles:
            if title in line and proc.info["memory_info"] is not None:
                out[title] += proc.info["memory_info"].rss / 2**20
    return {t: round(v, 1) for t, v in out.items()}


def chat_body(i: int, words: int = 24, stream: bool = True) -> dict:
    """A distinct chat request: `words` prompt words unique to `i` (the fake's reply is
    "echo:" and those words: words + 1 tokens); streams with usage unless `stream` False."""
    content = " ".join(f"w{i}x{j}" for j in range(words))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": words + 1,  # the whole echo (the fake stops at 32 tokens by default)
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def expected(body: dict) -> tuple[str, dict]:
    """(content, usage) an undisturbed FakeEngine gives `body`."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    engine = FakeEngine(MODEL, 512)
    request = EngineRequest("x", "chat", ChatCompletionRequest.model_validate(body))

    async def run() -> list:
        await engine.start()
        return [d async for d in engine.generate(request)]

    deltas = asyncio.run(run())
    usage = {"prompt_tokens": deltas[-1].prompt_tokens}
    usage["completion_tokens"] = deltas[-1].completion_tokens
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return "".join(d.text for d in deltas), usage


@dataclass
class Result:
    """One client request as seen on the wire."""

    status: int = 0
    text: str = ""
    usage: dict | None = None
    ids: set[str] = field(default_factory=set)
    finish: str | None = None
    done: bool = False
    error: dict | None = None
    retry_after: str | None = None
    attempts: int = 1
    seconds: float = 0.0

    def complete(self, want: tuple[str, dict]) -> bool:
        """200, one id, [DONE], a finish reason, and exactly the expected text and usage."""
        return (
            self.status == 200
            and self.done
            and self.error is None
            and self.finish is not None
            and len(self.ids) == 1
            and (self.text, _counts(self.usage)) == (want[0], _counts(want[1]))
        )


def _counts(usage: dict | None) -> dict | None:
    """The usage's token counts: what an undisturbed run must reproduce exactly. The prompt
    tokens the prefix cache served (prompt_tokens_details) depend on what ran before (a
    reference run warms the cache for the run compared with it), not on the output."""
    if usage is None:
        return None
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


async def stream_one(client: Any, url: str, body: dict) -> Result:
    """POST a streaming chat request and read the whole SSE stream."""
    result, start = Result(), time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as r:
            result.status = r.status_code
            result.retry_after = r.headers.get("retry-after")
            if r.status_code != 200:
                result.error = _json_or_text(await r.aread())
            elif not body.get("stream"):
                _see_json(result, _json_or_text(await r.aread()))
            else:
                async for line in r.aiter_lines():
                    _see_line(result, line)
    except Exception as err:  # a dropped connection is a lost request, not a crash
        result.error = {"transport": repr(err)}
    result.seconds = time.perf_counter() - start
    return result


def _see_line(result: Result, line: str) -> None:
    if not line.startswith("data: "):
        return
    if line == "data: [DONE]":
        result.done = True
        return
    event = json.loads(line[6:])
    if "error" in event:
        result.error = event["error"]
        return
    result.ids.add(event["id"])
    result.usage = event.get("usage") or result.usage
    for choice in event.get("choices") or []:
        result.text += choice["delta"].get("content") or ""
        result.finish = choice.get("finish_reason") or result.finish


def _see_json(result: Result, body: dict) -> None:
    choice = body["choices"][0]
    result.text = choice["message"].get("content") or ""
    result.finish, result.usage = choice["finish_reason"], body["usage"]
    result.ids, result.done = {body["id"]}, True


def _json_or_text(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw[:200].decode(errors="replace")}


async def send_all(
    base: str,
    bodies: list[dict],
    concurrency: int,
    *,
    on_done: Any = None,
    retry_503: int = 0,
) -> list[Result]:
    """Send `bodies` with at most `concurrency` in flight; `on_done(n)` after each finishes.
    A 503 with Retry-After is retried up to `retry_503` times after the advised delay."""
    import httpx

    url = f"{base}/v1/chat/completions"
    gate = asyncio.Semaphore(concurrency)
    finished = 0
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:

        async def one(body: dict) -> Result:
            nonlocal finished
            async with gate:
                result = await stream_one(client, url, body)
                for attempt in range(retry_503):
                    if result.status != 503 or result.retry_after is None:
                        break
                    await asyncio.sleep(float(result.retry_after))
                    result = await stream_one(client, url, body)
                    result.attempts = attempt + 2
            finished += 1
            if on_done is not None:
                on_done(finished)
            return result

        return await asyncio.gather(*(one(b) for b in bodies))


def metric(base: str, name: str) -> float:
    """Sum of a Prometheus counter/gauge over its series in the ingress's /metrics."""
    import httpx

    text = httpx.get(f"{base}/metrics", timeout=10, trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )

"""Where an engine's start is, from vLLM's own log lines (engine/start_phases.py)."""

from __future__ import annotations

from agentserve.engine.start_phases import current_phase, describe_phases, log_phases

STEPS = [
    "(EngineCore pid=1) INFO 11-26 10:17:10 [core.py:93] Initializing a V1 LLM engine (v0.32.0)",
    "(Worker pid=2) INFO 11-26 10:17:19 [default_loader.py:501] Loading weights took 0.24 seconds",
    "(Worker pid=2) INFO 11-26 10:17:20 [cpu_model_runner.py:87] Warming up model for the "
    "compilation...",
    "(Worker pid=2) INFO 11-26 10:18:38 [cpu_model_runner.py:91] Warming up done.",
    "(EngineCore pid=1) INFO 11-26 10:18:40 [core.py:402] init engine (profile, create kv "
    "cache, warmup model) took 80.87 s",
]


def test_the_phase_follows_the_furthest_marker_logged():
    assert current_phase("") is None  # Ray and the replica are still starting
    seen = [current_phase("\n".join(STEPS[: i + 1])) for i in range(len(STEPS))]
    assert seen == [
        "loading weights",
        "preparing the compile warm-up",
        "compiling the model (torch.compile; later starts load the cache)",
        "profiling memory and creating the KV cache",
        "engine ready; the replica is finishing its start",
    ]
    # files are read in name order, not time order: the furthest phase still wins
    assert current_phase("\n".join(reversed(STEPS))) == seen[-1]


def test_the_phases_read_as_one_line():
    phases = log_phases("\n".join(STEPS))
    assert phases == {"weights_load": 0.24, "compile": 78.0, "engine_init": 80.87}
    assert describe_phases(phases) == "weights 0.24 s, compile 78 s, engine init 80.87 s"
    assert describe_phases({}) == ""

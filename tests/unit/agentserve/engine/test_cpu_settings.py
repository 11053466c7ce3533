"""The CPU engine's environment (engine/cpu_settings.py) and the machine facts it is chosen
for (engine/cpu_info.py): table tests, no vLLM."""

from __future__ import annotations

import pytest
from agentserve.engine.cpu_info import CpuInfo, cpu_class, parse_cpuinfo
from agentserve.engine.cpu_settings import engine_environment, iomp_library, omp_bind
from agentserve_bench.settings_bundles import SCHEDULE_OFF, default_settings, fitted_settings
from profile_fakes import drop_profile, set_profile

EPYC_AVX2 = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2
processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2
"""
XEON_AMX = """model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
"""


@pytest.mark.parametrize(
    ("text", "model", "features", "klass"),
    [
        (EPYC_AVX2, "AMD EPYC", ("avx2",), "avx2"),
        (XEON_AMX, "Intel(R) Xeon(R) Platinum 8480+",
         ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"), "amx"),
        ("model name: X\nflags: avx2 avx512f\n", "X", ("avx2", "avx512f"), "avx512"),
        ("model name: X\nflags: avx2 avx512f avx512_bf16\n", "X",
         ("avx2", "avx512f", "avx512_bf16"), "avx512_bf16"),
        ("", "unknown CPU", (), "other"),
    ],
)  # fmt: skip
def test_cpuinfo_is_read_into_features_and_class(text, model, features, klass):
    got_model, got_features = parse_cpuinfo(text)
    assert (got_model, got_features) == (model, features)
    assert cpu_class(got_features) == klass


def test_describe_says_when_there_are_no_bf16_instructions():
    assert "no bf16" in CpuInfo("AMD EPYC", 2, ("avx2",)).describe()
    assert "no bf16" not in CpuInfo("Xeon", 8, ("avx2", "avx512_bf16")).describe()
    assert CpuInfo("AMD EPYC", 2, ("avx2",)).as_dict()["cpu_class"] == "avx2"


@pytest.mark.parametrize(
    ("policy", "cores", "bind"),
    [
        ("reserve", [0, 1], "1"),
        ("reserve", [0, 1, 2, 3], "1,2,3"),
        ("reserve", [2, 5, 3], "3,5"),  # the lowest usable core is left to the platform
        ("reserve", [0], "0"),  # one core: nothing to leave
        ("all", [0, 1], "0,1"),
        ("auto", [0, 1], "auto"),
        ("reserve", [], "auto"),
    ],
)
def test_omp_binding_per_policy(policy, cores, bind):
    assert omp_bind(policy, cores) == bind


def test_an_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="reserve, all, auto"):
        omp_bind("half", [0, 1])


def test_environment_fills_only_what_is_unset(tmp_path, monkeypatch):
    from agentserve.engine import cpu_settings

    monkeypatch.setattr(cpu_settings, "_this_cpu_class", lambda: "other")
    drop_profile(monkeypatch, "other")  # a CPU never measured: "mp"
    iomp = tmp_path / "libiomp5.so"
    iomp.write_bytes(b"")
    env = engine_environment({}, cores=[0, 1], iomp=iomp)
    assert env == {
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_CPU_OMP_THREADS_BIND": "0,1",  # the measured default: every core, GNU OpenMP
    }
    assert engine_environment({"AGENTSERVE_CPU_IOMP": "1"}, [0, 1], iomp)["LD_PRELOAD"] == str(iomp)
    assert (
        engine_environment({"AGENTSERVE_CPU_BIND": "reserve"}, [0, 1], iomp)[
            "VLLM_CPU_OMP_THREADS_BIND"
        ]
        == "1"
    )
    user = {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "8", "LD_PRELOAD": "/x.so",
            "AGENTSERVE_CPU_IOMP": "1"}  # fmt: skip
    assert engine_environment(user, cores=[0, 1], iomp=iomp) == {"LD_PRELOAD": f"/x.so:{iomp}"}
    # an OpenMP the user preloads (GNU or LLVM) is kept: two OpenMP runtimes cannot mix
    gomp = {"LD_PRELOAD": "/l/libgomp.so", "AGENTSERVE_CPU_IOMP": "1"}
    assert "LD_PRELOAD" not in engine_environment(gomp, [0, 1], iomp)
    assert engine_environment({"AGENTSERVE_CPU_BIND": "all"}, [0, 1], None) == {
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_CPU_OMP_THREADS_BIND": "0,1",
    }
    assert "LD_PRELOAD" not in engine_environment({"AGENTSERVE_CPU_IOMP": "0"}, [0, 1], iomp)


def test_iomp_is_found_in_an_environment_prefix(tmp_path):
    assert iomp_library(str(tmp_path)) is None
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    assert iomp_library(str(tmp_path)) == tmp_path / "lib" / "libiomp5.so"


def test_compile_on_cpu_env_overrides_measured_choice_and_unmeasured_kinds_compile(monkeypatch):
    from agentserve.engine import cpu_settings

    set_profile(monkeypatch, "avx2", compile=False)
    drop_profile(monkeypatch, "amx")
    assert cpu_settings.compile_on_cpu({}, "avx2") is False
    assert cpu_settings.compile_on_cpu({}, "amx") is True  # never measured: vLLM's default
    assert cpu_settings.compile_on_cpu({"AGENTSERVE_CPU_COMPILE": "1"}, "avx2") is True
    assert cpu_settings.compile_on_cpu({"AGENTSERVE_CPU_COMPILE": "0"}, "amx") is False
    with pytest.raises(ValueError, match="AGENTSERVE_CPU_COMPILE"):
        cpu_settings.compile_on_cpu({"AGENTSERVE_CPU_COMPILE": "yes"}, "amx")


def test_engine_kwargs_run_eager_on_cpu_only_when_chosen_and_never_over_the_spec(monkeypatch):
    from agentserve.engine import vllm_args
    from agentserve.spec import ModelSpec

    monkeypatch.setattr(vllm_args, "compile_on_cpu", lambda: False)
    assert vllm_args.engine_kwargs(ModelSpec(), "/m")["enforce_eager"] is True
    gpu = ModelSpec(replicas={"num_gpus": 1})
    assert "enforce_eager" not in vllm_args.engine_kwargs(gpu, "/m")
    own = ModelSpec(engine_args={"enforce_eager": False})
    assert vllm_args.engine_kwargs(own, "/m")["enforce_eager"] is False
    monkeypatch.setattr(vllm_args, "compile_on_cpu", lambda: True)
    assert "enforce_eager" not in vllm_args.engine_kwargs(ModelSpec(), "/m")


def test_the_uni_executor_puts_one_cpu_worker_in_the_engine_core(monkeypatch):
    from agentserve.engine import cpu_settings, vllm_args
    from agentserve.spec import ModelSpec

    env = {"AGENTSERVE_CPU_EXECUTOR": "uni"}
    # vLLM's CPU platform turns "uni" back into "mp" unless multiprocessing is off
    assert engine_environment(env, cores=[0, 1])["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    mp = {"AGENTSERVE_CPU_EXECUTOR": "mp"}
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_environment(mp, cores=[0, 1])
    # unset: the measured choice for the kind of CPU; vLLM's own (mp) where never measured
    assert cpu_settings.cpu_executor({}, "amx") == cpu_settings.engine_profile("amx").executor
    assert cpu_settings.cpu_executor({}, "some-unmeasured-kind") == "mp"
    kept = {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # set by the user: theirs
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_environment(kept, cores=[0, 1])
    with pytest.raises(ValueError, match="one of mp, uni"):
        cpu_settings.cpu_executor({"AGENTSERVE_CPU_EXECUTOR": "ray"})

    monkeypatch.setenv("AGENTSERVE_CPU_EXECUTOR", "uni")
    assert vllm_args.engine_kwargs(ModelSpec(), "/m")["distributed_executor_backend"] == "uni"
    gpu = ModelSpec(replicas={"num_gpus": 1})
    assert "distributed_executor_backend" not in vllm_args.engine_kwargs(gpu, "/m")
    monkeypatch.setenv("AGENTSERVE_CPU_EXECUTOR", "mp")
    assert "distributed_executor_backend" not in vllm_args.engine_kwargs(ModelSpec(), "/m")


def test_fits_read_the_default_settings_with_the_schedule_on_or_off():
    default = default_settings("avx512_bf16")
    assert fitted_settings(default, "avx512_bf16")
    assert fitted_settings(default + SCHEDULE_OFF, "avx512_bf16")
    assert fitted_settings(None, "avx512_bf16")  # rows from before the labels
    assert not fitted_settings("all-gomp", "avx512_bf16")  # another bundle: a comparison
    assert not fitted_settings(default + "/float32", "avx512_bf16")  # a dtype variant

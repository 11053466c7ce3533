"""What a benchmark measured per kind of machine, read from JSON: one profile per kind.

`platform/agentserve/profiles/<cpu_class>.json` (cpu_class: engine/cpu_info.py) holds the
choices and fits `agentserve bench ...` measured on that kind of machine; `pooled.json` the
figures fitted over every kind's rows (each method's acceptance on the bundled model, the
served factors). Each section is `{"values": ..., "source": {"command", "date", "rows"}}`:
what was measured, by which command, when, and the docs/benchmarks/*.json file holding the
rows. The benchmarks write the sections (agentserve_bench/profile_write.py); the runtime
reads them here and holds no measured numbers. A kind of machine without a profile (or a
profile without a section) gets None: the caller keeps vLLM's own defaults.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "POOLED",
    "PROFILE_DIR",
    "MachineProfile",
    "ProfileError",
    "load_profile",
    "machine_profile",
    "section",
]

PROFILE_DIR = Path(__file__).parent
POOLED = "pooled"  # the profile of figures fitted over every kind of machine's rows


class ProfileError(ValueError):
    """A profile file that is not valid JSON or does not match MachineProfile."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    command: str = Field(description="the command that measured the values")
    date: str = Field(description="when it ran (YYYY-MM-DD)")
    rows: str = Field(description="the docs/benchmarks/*.json file(s) holding the rows")


class Speculation(_Strict):
    method: str | None = Field(description="vLLM speculative method; None: plain decoding")
    num_speculative_tokens: int | None = Field(
        default=None, description="the k the deciding rows drafted"
    )
    dtype: str | None = Field(
        default=None, description="dtype the rows were measured in; None: the spec's own"
    )


class EngineSettings(_Strict):
    executor: Literal["mp", "uni"] = Field(description="vLLM CPU executor (cpu_settings)")
    allocator: Literal["glibc", "tcmalloc", "jemalloc"] = Field(
        description="allocator the engine preloads (engine/cpu_malloc.py)"
    )
    quiet_ray: bool = Field(description="Ray's processes in the quiet environment (ray_env)")


class ServedFit(_Strict):
    base_ms: float = Field(description="served step time at the knee")
    knee_tokens: float = Field(description="tokens per step before the slope")
    per_token_ms: float = Field(description="step time per token past the knee")
    prefill_ms_per_token: float = Field(description="TTFT per prompt token")


class StepTerms(_Strict):
    base_ms: float = Field(description="GEMM step time at the knee")
    knee_tokens: float = Field(description="tokens per step before the slope")
    per_token_ms: float = Field(description="GEMM time per token past the knee")


class Acceptance(_Strict):
    alpha_1: float = Field(description="per-token acceptance at batch 1")
    drop_per_doubling: float = Field(description="acceptance lost per doubling of the batch")


class EngineStep(_Strict):
    batch: int = Field(description="sequences in the step")
    drafted: int = Field(description="tokens drafted per sequence (0: plain decoding)")
    step_ms: float = Field(description="wall time of one whole engine step")
    tau: float | None = Field(
        default=None, description="tokens emitted per sequence per step; None: not measured"
    )


class ServedFactors(_Strict):
    batch_1: dict[str, float] = Field(description="{method: served / predicted} at c=1")
    loaded: dict[str, float] = Field(description="the same at concurrency 4")
    step: float = Field(description="served plain step / GEMM decode step at batch 1")


def _section(values_type):
    """A section model: `values` of `values_type` and where they came from."""

    class Section(_Strict):
        values: values_type = Field(description="what was measured")  # type: ignore[valid-type]
        source: Source = Field(description="where it came from")

    return Section


class MachineProfile(_Strict):
    """One kind of machine's measured choices and fits; every section optional."""

    machine: str = Field(description="cpu_class (engine/cpu_info.py), or 'pooled'")
    speculation: _section(dict[str, Speculation]) | None = Field(  # type: ignore[valid-type]
        default=None, description="{model: default speculation} (bench speculative-served)"
    )
    engine: _section(EngineSettings) | None = Field(  # type: ignore[valid-type]
        default=None, description="engine settings (bench speculative-served --settings)"
    )
    compile: _section(bool) | None = Field(  # type: ignore[valid-type]
        default=None, description="torch.compile (True) or eager (bench startup)"
    )
    served_fit: _section(dict[str, ServedFit]) | None = Field(  # type: ignore[valid-type]
        default=None, description="{dtype: served step fit} (bench fit-latency)"
    )
    step_terms: _section(dict[str, StepTerms]) | None = Field(  # type: ignore[valid-type]
        default=None, description="{dtype: GEMM step fit} (bench calibrate)"
    )
    acceptance: _section(dict[str, Acceptance]) | None = Field(  # type: ignore[valid-type]
        default=None, description="{method: acceptance} over served rows (pooled)"
    )
    draft_rate: _section(dict[str, float]) | None = Field(  # type: ignore[valid-type]
        default=None, description="{method: share of steps drafting} (pooled)"
    )
    engine_steps: _section(list[EngineStep]) | None = Field(  # type: ignore[valid-type]
        default=None, description="whole-engine steps (LatencyModel's step defaults' rows)"
    )
    served_factor: _section(ServedFactors) | None = Field(  # type: ignore[valid-type]
        default=None, description="served over predicted speedups (pooled)"
    )

    def value(self, section: str):
        """The section's values, or None when the profile has no such section."""
        found = getattr(self, section)
        return None if found is None else found.values


def load_profile(path: Path) -> MachineProfile:
    """The profile in `path`; ProfileError (naming the file) when it is not a valid one."""
    try:
        return MachineProfile.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ProfileError(f"{path}: not a valid machine profile: {exc}") from exc


@functools.cache
def machine_profile(machine: str, directory: Path = PROFILE_DIR) -> MachineProfile | None:
    """The profile of this kind of machine (a cpu_class, "cuda", POOLED), or None where
    none was measured."""
    path = directory / f"{machine}.json"
    return load_profile(path) if path.is_file() else None


def section(machine: str, name: str):
    """`machine`'s values of section `name`, or None where not measured."""
    profile = machine_profile(machine)
    return None if profile is None else profile.value(name)

"""What every section of the spec shares: the strict base model and the Hub revision field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _revision_field(of: str) -> Any:
    """The optional Hub revision of a Hugging Face id in field `of`."""
    return Field(
        None,
        max_length=255,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]*$",
        description=f"Hub revision (branch, tag or commit) of a Hugging Face id `{of}`; "
        "null = main. Pin a commit for reproducible deployments.",
    )

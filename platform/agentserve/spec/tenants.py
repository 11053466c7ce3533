"""Tenants: TenantSpec (API key hash, SLA, limits), SLASpec and RateLimitSpec, and how an API
key is hashed for the spec."""

from __future__ import annotations

import hashlib
import re

from pydantic import Field, field_validator

from agentserve.spec.base import _Spec

_SHA256_HEX = r"^[0-9a-f]{64}$"


def hash_api_key(key: str) -> str:
    """Return the lowercase hex SHA-256 of an API key, the form stored in TenantSpec."""
    if not key:
        raise ValueError("API key must not be empty")
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class SLASpec(_Spec):
    """Latency objectives, at the 95th percentile."""

    ttft_p95_ms: float = Field(1000.0, gt=0, description="Time to first token, ms.")
    tpot_p95_ms: float = Field(100.0, gt=0, description="Time per output token, ms.")

    def seconds(self) -> tuple[float, float]:
        """(TTFT objective, TPOT objective) in seconds: the one place they leave milliseconds."""
        return self.ttft_p95_ms / 1000, self.tpot_p95_ms / 1000


class RateLimitSpec(_Spec):
    """Per-tenant limits; null = unlimited."""

    requests_per_minute: int | None = Field(None, gt=0, description="Requests per minute.")
    tokens_per_minute: int | None = Field(None, gt=0, description="Prompt + output tokens/min.")
    max_concurrent_requests: int | None = Field(None, gt=0, description="Requests in flight.")


class TenantSpec(_Spec):
    """A tenant: its API key hash, SLA and limits."""

    name: str = Field(
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Tenant name, used in metrics, traces and logs.",
    )
    api_key_sha256: str = Field(
        description="Lowercase hex SHA-256 of the API key (never the key itself).",
        json_schema_extra={"pattern": _SHA256_HEX},
    )
    sla: SLASpec = Field(description="Latency objectives.")
    rate_limit: RateLimitSpec = Field(default_factory=RateLimitSpec, description="Limits.")
    sla_class: str | None = Field(None, description="Class label for metrics, e.g. batch.")

    @field_validator("api_key_sha256")
    @classmethod
    def _check_hash(cls, value: str) -> str:
        if not re.fullmatch(_SHA256_HEX, value):
            raise ValueError(
                "must be the SHA-256 of the API key as 64 lowercase hex characters, never the "
                "key itself (agentserve.spec.hash_api_key, or `printf %s KEY | sha256sum`)"
            )
        return value

"""The serving front: ServerSpec (HTTP ingress, admin ports, limits) and TracingSpec
(OpenTelemetry export)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from agentserve.spec.base import _Spec


class TracingSpec(_Spec):
    """OpenTelemetry tracing; without an endpoint it stays off."""

    enabled: bool | None = Field(
        None,
        description="Export traces: null = whenever an endpoint is set (otlp_endpoint, or "
        "OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT); false = ignore otlp_endpoint (the OTEL_* "
        "variables still export; OTEL_SDK_DISABLED=true turns all of it off).",
    )
    otlp_endpoint: str | None = Field(None, description="OTLP URL, e.g. http://otel:4318.")
    sample_ratio: float = Field(1.0, ge=0, le=1, description="Fraction of traces sampled.")
    service_name: str = Field("agentserve", min_length=1, description="OTel service.name.")

    @field_validator("otlp_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} must start with http:// or https://")
        return value


class ServerSpec(_Spec):
    """The HTTP ingress."""

    host: str = Field("127.0.0.1", min_length=1, description="Address the API binds to.")
    port: int = Field(8000, ge=1, le=65535, description="OpenAI-compatible API port.")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Port of the admin endpoints (/metrics, /status), served by the ingress on "
        "host; null = they answer only loopback clients, on the API port.",
    )
    max_queue_len: int = Field(
        64, ge=1, description="Queued requests per model (per ingress replica), then 503."
    )
    max_request_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes; a larger one gets 413.",
    )
    request_timeout_s: float = Field(300.0, gt=0, description="Seconds before a request fails.")
    body_read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds a client has to send its whole request body, counted from its "
        "headers; a slower one gets 408 request_timeout (a trickling body cannot hold an "
        "ingress slot longer).",
    )
    stream_stall_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds a streaming client may take no output (its connection's buffers "
        "full) before its stream is ended and its generation aborted; until then the "
        "ingress reads the engine stream only as fast as the client reads.",
    )
    max_unadmitted_per_tenant: int = Field(
        16,
        ge=1,
        description="Requests one tenant may have that are not yet admitted (body being read "
        "or checked), per ingress replica; more get 429 too_many_unadmitted_requests, so one "
        "tenant's slow connections cannot fill the ingress. Not applied in open mode (no "
        "tenants).",
    )
    trusted_hosts: list[str] = Field(
        default_factory=list,
        description="Host header names the API answers in open mode (no tenants), besides "
        "localhost, 127.0.0.1, ::1 and host; others get 400 (DNS rebinding). With tenants "
        "any Host is accepted.",
    )
    max_migrations: int = Field(
        2,
        ge=0,
        le=8,
        description="Times one request may be continued on another replica when its replica "
        "dies mid-request (prompt + output so far); 0 = fail the request instead.",
    )

    ingress_replicas: int | None = Field(
        None,
        ge=1,
        le=16,
        description="Ingress replicas, each serving the whole API (Serve's proxy spreads "
        "requests over them, so one can die without taking every stream); tenant limits hold "
        "across them (admission/shared_limits.py). With metrics_port set, replica k of a node "
        "serves the admin endpoints on metrics_port + k. null = 1 with `agentserve up`, 2 in "
        "a cluster (the operator).",
    )

    @model_validator(mode="after")
    def _check_ports(self) -> ServerSpec:
        if self.metrics_port is None:
            return self
        last = self.metrics_port + (self.ingress_replicas or 1) - 1
        if self.metrics_port <= self.port <= last:
            raise ValueError(
                f"metrics_port must differ from port ({self.port}); with ingress_replicas the "
                f"admin ports are metrics_port .. metrics_port + ingress_replicas - 1"
            )
        if last > 65535:
            raise ValueError(f"admin ports run past 65535 (up to {last})")
        return self

"""The agent program's OTel provider: OTLP export when configured, plus a bounded in-memory
recorder so a program can print its own trace tree (`format_tree`).

Export follows the same rules as the server (agentserve.tracing.trace_export): an explicit
endpoint, else OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT; none = record locally only.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterable, Mapping, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from agentserve import tracing as t
from agentserve.spec import TracingSpec

__all__ = ["SpanRecorder", "format_tree", "make_sdk_provider"]


class SpanRecorder(SpanExporter):
    """Keeps the last `max_spans` finished spans in memory (thread-safe)."""

    def __init__(self, max_spans: int = 10_000):
        self._spans: collections.deque[ReadableSpan] = collections.deque(maxlen=max_spans)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._spans.extend(spans)
        return SpanExportResult.SUCCESS

    def spans(self, trace_id: int | None = None) -> list[ReadableSpan]:
        """Finished spans, oldest first; only those of `trace_id` when given."""
        with self._lock:
            spans = list(self._spans)
        return [s for s in spans if trace_id is None or s.context.trace_id == trace_id]

    def shutdown(self) -> None:
        """Nothing to release."""


def make_sdk_provider(
    service_name: str,
    otlp_endpoint: str | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[TracerProvider, SpanRecorder, str | None]:
    """(provider, recorder, export URL or None) for an agent program."""
    env = os.environ if env is None else env
    spec = TracingSpec(otlp_endpoint=otlp_endpoint, service_name=service_name)
    export = t.trace_export(spec, env)
    recorder = SpanRecorder()
    if export is None:
        provider = t.make_provider(t.TraceExport("memory", service_name=service_name), recorder)
        return provider, recorder, None
    provider = t.make_provider(export)
    provider.add_span_processor(SimpleSpanProcessor(recorder))
    return provider, recorder, export.endpoint


def format_tree(spans: Iterable[ReadableSpan], attributes: Sequence[str] = ()) -> str:
    """An indented tree, one line per span: name, duration in ms, chosen attributes.

    Spans whose parent is not among `spans` are roots; children are ordered by start time.
    """
    spans = sorted(spans, key=lambda s: s.start_time or 0)
    ids = {s.context.span_id for s in spans}
    children: dict[int | None, list[ReadableSpan]] = collections.defaultdict(list)
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        children[parent if parent in ids else None].append(span)
    lines: list[str] = []

    def walk(span: ReadableSpan, depth: int) -> None:
        ms = ((span.end_time or span.start_time or 0) - (span.start_time or 0)) / 1e6
        extra = [f"{k}={span.attributes[k]}" for k in attributes if k in (span.attributes or {})]
        lines.append(
            "  " * depth + f"{span.name}  {ms:.0f} ms" + ("  " if extra else "") + " ".join(extra)
        )
        for child in children.get(span.context.span_id, []):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)
    return "\n".join(lines)

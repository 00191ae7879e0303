"""The platform's own spans: thin helpers over OpenTelemetry's API that cost one attribute
read when tracing is off, so the request path pays nothing for it then (a span of the API's
no-op tracer still costs a few microseconds, and a payload's carrier bytes in Redis).

The helpers never make a span current inside an async generator: a context attached there
can be detached from another task when the generator is closed late. Spans are handed on
explicitly (`parent`) instead, and a call's headers get its span's context (`headers`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

CLIENT = SpanKind.CLIENT  # a call to another service (an engine)
AttributeValue = str | int | float | bool
Attributes = Mapping[str, AttributeValue]

# A parent that starts a trace of its own (a batch line's).
NEW_TRACE = Context()

_tracer: trace.Tracer | None = None


def use(tracer: trace.Tracer | None) -> None:
    """Spans go to `tracer` from now on; None turns them off (`setup.configure` calls it)."""
    global _tracer
    _tracer = tracer


def enabled() -> bool:
    return _tracer is not None


def here() -> Context | None:
    """The current context (the span being served), to start later spans under."""
    if _tracer is None:
        return None
    return trace.set_span_in_context(trace.get_current_span())


def start(
    name: str,
    *,
    parent: Context | None = None,
    attributes: Attributes | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    at: float | None = None,
) -> Span | None:
    """A span, not made current; None when tracing is off. `parent`: under the current
    span when None. `at`: when it started (time.time()), if before now."""
    if _tracer is None:
        return None
    start_time = None if at is None else int(at * 1e9)
    return _tracer.start_span(
        name, context=parent, kind=kind, attributes=attributes, start_time=start_time
    )


def end(span: Span | None, attributes: Attributes | None = None, error: str = "") -> None:
    """Ends `span` (None: nothing), with `attributes`; `error` marks it failed and says why."""
    if span is None or not span.is_recording():
        return
    if attributes:
        span.set_attributes(attributes)
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def event(span: Span | None, name: str, attributes: Attributes | None = None) -> None:
    if span is not None:
        span.add_event(name, attributes)


def annotate(attributes: Attributes) -> None:
    """Sets `attributes` on the current span, where tracing is on."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)


def under(span: Span | None) -> Context | None:
    """The context of `span`, to start a child of it elsewhere (`start(parent=...)`)."""
    if span is None:
        return None
    return trace.set_span_in_context(span)


@contextlib.contextmanager
def current(name: str, attributes: Attributes | None = None) -> Iterator[Span | None]:
    """A span, current for the block (a plain coroutine's, never a generator's); an
    exception in the block marks it failed. Yields None when tracing is off."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=attributes) as span:
        yield span


def carrier(span: Span | None) -> dict[str, str] | None:
    """`span`'s context as W3C trace-context fields, for a message to another process."""
    if span is None:
        return None
    fields: dict[str, str] = {}
    inject(fields, context=trace.set_span_in_context(span))
    return fields


def received(fields: Any) -> Context | None:
    """The context a message's `carrier` fields hold (None when tracing is off, or when the
    message carries none: the span then starts a trace of its own)."""
    if _tracer is None or not isinstance(fields, dict) or not fields:
        return None
    return extract(fields)


def headers(span: Span | None) -> dict[str, str] | None:
    """HTTP headers that carry `span`'s context to the service called (`traceparent`)."""
    return carrier(span)

"""Every answer of the tenant API (/v1/) carries `X-Request-Id`, errors included, and the
web's log lines about the request carry the same id.

OpenAI's clients expose it (`_request_id` in the `openai` library) and people quote it when
they ask what happened to a request. The web gives each /v1/ request its id as it arrives
(`request_id_scope`): a request that is queued takes it as its job id, which its ledger row
(the console's "Find a request") and the workers' log lines carry too; an answer that has
none of its own gets it. `RequestIdFilter` ends each log line written while the request is
served with ` request_id=<id>`, so `grep <id>` over the web's log finds them.

The request's tenant and engine are named the same way once they are known (`bind`): the web
binds the tenant when it admits the request and the engine when the worker grants it the
call; a worker binds the job's id, tenant and engine when it runs the job. The lines end with
` tenant=<slug> engine=<name>` after the id, and a JSON line (plumbing.json_logs) carries them
as fields, with the current OpenTelemetry span's ids where one is current.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextvars import ContextVar
from typing import Any

# The OpenTelemetry API is optional here: without it no span is ever current.
try:
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - depends on what is installed
    _trace = None  # type: ignore[assignment]

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

HEADER = b"x-request-id"

# The id of the request the running task serves; None outside one. A context variable: each
# request is a task of its own, and the tasks and callbacks it starts inherit it.
_current: ContextVar[str | None] = ContextVar("gpushare_request_id", default=None)
# Its tenant's slug and the engine that runs it, once known; None until then. The same kind.
_tenant: ContextVar[str | None] = ContextVar("gpushare_tenant", default=None)
_engine: ContextVar[str | None] = ContextVar("gpushare_engine", default=None)


class _Keep(enum.Enum):
    KEEP = enum.auto()


KEEP = _Keep.KEEP


def current() -> str | None:
    """The id of the request being served here, if any."""
    return _current.get()


@contextlib.contextmanager
def request_id_scope() -> Iterator[str]:
    """A fresh request id, current for what runs inside."""
    request_id = uuid.uuid4().hex
    # A request starts knowing nothing of its tenant and engine; what it binds ends with it.
    id_token, tenant_token, engine_token = (
        _current.set(request_id), _tenant.set(None), _engine.set(None)
    )  # fmt: skip
    try:
        yield request_id
    finally:
        _engine.reset(engine_token)
        _tenant.reset(tenant_token)
        _current.reset(id_token)


def bind(
    *,
    request_id: str | _Keep | None = KEEP,
    tenant: str | _Keep | None = KEEP,
    engine: str | _Keep | None = KEEP,
) -> None:
    """Makes what is given current for the rest of the running task (and the tasks and
    callbacks it starts from here on); an empty string or None: not known."""
    for var, value in ((_current, request_id), (_tenant, tenant), (_engine, engine)):
        if value is not KEEP:
            var.set(value or None)


def context() -> dict[str, str]:
    """What is known here of the request: `request_id`, `tenant`, `engine` (those known)."""
    known = {"request_id": _current.get(), "tenant": _tenant.get(), "engine": _engine.get()}
    return {name: value for name, value in known.items() if value}


def with_request_id(send: Send, request_id: str) -> Send:
    """`send`, with `X-Request-Id: request_id` added to the answer's headers where it has none."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers") or [])
            if not any(name.lower() == HEADER for name, _ in headers):
                headers.append((HEADER, request_id.encode()))
                message = {**message, "headers": headers}
        await send(message)

    return sending


class RequestIdFilter(logging.Filter):
    """Gives each record what is known of the request it was written for, as the caller's
    task knows it: `request_tag`, ` request_id=<id> tenant=<slug> engine=<name>` (those
    known; empty outside a request: the plain format ends with it), and `log_context`, the
    same as a dict with the current span's `trace_id` and `span_id` (the JSON format's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        known = context()
        record.request_tag = "".join(f" {name}={value}" for name, value in known.items())
        record.log_context = known | span_ids()
        return True


def span_ids() -> dict[str, str]:
    """The current OpenTelemetry span's `trace_id` and `span_id` (hex, as its exporters and
    W3C `traceparent` write them) where one is current; none without opentelemetry."""
    if _trace is None:
        return {}
    span = _trace.get_current_span().get_span_context()
    if not span.is_valid:
        return {}
    return {"trace_id": format(span.trace_id, "032x"), "span_id": format(span.span_id, "016x")}

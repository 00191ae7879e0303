"""Every answer of the tenant API (/v1/) carries `X-Request-Id`, errors included, and the
web's log lines about the request carry the same id.

OpenAI's clients expose it (`_request_id` in the `openai` library) and people quote it when
they ask what happened to a request. The web gives each /v1/ request its id as it arrives
(`request_id_scope`): a request that is queued takes it as its job id, which its ledger row
(the console's "Find a request") and the workers' log lines carry too; an answer that has
none of its own gets it. `RequestIdFilter` ends each log line written while the request is
served with ` request_id=<id>`, so `grep <id>` over the web's log finds them.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextvars import ContextVar
from typing import Any

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

HEADER = b"x-request-id"

# The id of the request the running task serves; None outside one. A context variable: each
# request is a task of its own, and the tasks and callbacks it starts inherit it.
_current: ContextVar[str | None] = ContextVar("gpushare_request_id", default=None)


def current() -> str | None:
    """The id of the request being served here, if any."""
    return _current.get()


@contextlib.contextmanager
def request_id_scope() -> Iterator[str]:
    """A fresh request id, current for what runs inside."""
    request_id = uuid.uuid4().hex
    token = _current.set(request_id)
    try:
        yield request_id
    finally:
        _current.reset(token)


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
    """Gives each record `request_tag`: ` request_id=<id>` while a request is served, else
    empty (the log format ends with it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = _current.get()
        record.request_tag = f" request_id={request_id}" if request_id else ""
        return True

"""Every answer of the tenant API (/v1/) carries `X-Request-Id`, errors included.

OpenAI's clients expose it (`_request_id` in the `openai` library) and people quote it when
they ask what happened to a request. An answer that has one keeps it (a queued request's is
its job id, which its ledger row and the logs carry too); any other gets a fresh one.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

HEADER = b"x-request-id"


def with_request_id(send: Send) -> Send:
    """`send`, with `X-Request-Id` added to the answer's headers where it has none."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers") or [])
            if not any(name.lower() == HEADER for name, _ in headers):
                headers.append((HEADER, uuid.uuid4().hex.encode()))
                message = {**message, "headers": headers}
        await send(message)

    return sending

"""A request's body must arrive whole within a deadline (GPUSHARE_BODY_TIMEOUT_S).

A client that sends its body a byte at a time holds the web's connection, memory and, for an
upload, a spooled file for as long as it likes. Every HTTP request's `receive` is wrapped: the
body's messages must all have come within the deadline, counted from the request's start,
or the client is answered 408 and the application is told that the client left (what it
does when a client really goes: it stops, and answers nothing more). Once the body is whole,
`receive` is the server's own (a stream waits on it for the client's disconnect).

Slow headers are the server's and the proxy's to bound: the application sees a request only
once its headers have come.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TIMED_OUT = (
    b'{"error": {"message": "The request body did not arrive in time.", '
    b'"type": "invalid_request_error", "code": "request_timeout", "param": null}}'
)


def body_deadline(receive: Receive, send: Send, timeout_s: float) -> Receive:
    """`receive`, with the body's messages held to `timeout_s` from now."""
    ends = time.monotonic() + timeout_s
    whole = False

    async def timed() -> Message:
        nonlocal whole
        if whole:
            return await receive()
        try:
            async with asyncio.timeout(max(0.0, ends - time.monotonic())):
                message = await receive()
        except TimeoutError:
            whole = True
            await _answer_timed_out(send)
            return {"type": "http.disconnect"}
        if message["type"] != "http.request" or not message.get("more_body", False):
            whole = True
        return message

    return timed


async def _answer_timed_out(send: Send) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(TIMED_OUT)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 408, "headers": headers})
    await send({"type": "http.response.body", "body": TIMED_OUT})

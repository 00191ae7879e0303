"""Every HTTP request's body is bounded before the application reads a byte of it.

Django's ASGI handler reads a request's whole body (into memory, then a file on disk) before
any view, authentication included, looks at the request; so does anything else that wants
the body whole. In front of the application, `bound_body` holds each request to a limit that
the caller picks by route:

- a declared `Content-Length` over the limit is answered 413 at once: the application is not
  called, and the body is never read;
- a body without a declared length (chunked) is counted as it arrives; the message that
  takes it past the limit is not handed on, the client is answered 413, and the application
  is told that the client left (what it does when a client really goes: it stops, and
  answers nothing more). Nothing more of the body is read: the answer closes the connection.

The application so never receives more than the limit. The 413 is OpenAI-shaped JSON where
the caller asks for it (the tenant API), a plain message elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TOO_LARGE_CODE = "request_too_large"


def declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length`, or None when it declares none (or none that is a
    length: the ASGI server has refused those; its body is counted as it arrives)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def bound_body(
    scope: Scope, receive: Receive, send: Send, limit: int, *, openai: bool
) -> tuple[Receive, Send] | None:
    """The request's `receive` and `send`, with its body held to `limit` bytes; None when it
    was answered 413 already (its declared length is over the limit), and the application
    must not be called."""
    declared = declared_length(scope)
    if declared is not None and declared > limit:
        await _answer_too_large(send, limit, openai)
        return None
    received = 0
    answered = False  # by this layer: the application's answer is dropped
    started = False  # the application's answer has begun: too late for a 413
    whole = False

    async def bounded_receive() -> Message:
        nonlocal received, answered, whole
        if answered:
            return {"type": "http.disconnect"}
        if whole:
            return await receive()
        message = await receive()
        if message["type"] != "http.request":
            return message
        received += len(message.get("body", b""))
        if received > limit:
            answered = True
            if not started:
                await _answer_too_large(send, limit, openai)
            return {"type": "http.disconnect"}
        if not message.get("more_body", False):
            whole = True
        return message

    async def bounded_send(message: Message) -> None:
        nonlocal started
        if answered:
            return
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    return bounded_receive, bounded_send


def _too_large_body(limit: int, openai: bool) -> tuple[bytes, bytes]:
    message = f"The request body is larger than the limit of {limit} bytes."
    if not openai:
        return b"text/plain; charset=utf-8", message.encode()
    error = {"message": message, "type": "invalid_request_error", "code": TOO_LARGE_CODE,
             "param": None}  # fmt: skip
    return b"application/json", json.dumps({"error": error}).encode()


async def _answer_too_large(send: Send, limit: int, openai: bool) -> None:
    content_type, body = _too_large_body(limit, openai)
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        # The rest of the body is never read: the connection cannot carry another request.
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})

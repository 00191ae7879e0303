"""A request body held to a limit (plumbing/body_limit.py), against a scripted ASGI
`receive`: a body within the limit passes through unchanged, a declared length over it is
answered 413 before anything is read, a body without one is cut off once it passes it, and
an answer the application has begun is never interrupted by a second one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

from plumbing.body_limit import bound_body, declared_length


class Client:
    """The server's side of one request: its messages, in order, and what it was sent."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.sent: list[MutableMapping[str, Any]] = []

    async def receive(self) -> MutableMapping[str, Any]:
        return self.messages.pop(0)

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)


def chunk(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/", "headers": list(headers)}


def test_a_body_within_the_limit_passes_through_unchanged():
    client = Client(chunk(b"12345", True), chunk(b"67890", False), {"type": "http.disconnect"})

    async def run() -> list[MutableMapping[str, Any]]:
        bounded = await bound_body(
            scope((b"content-length", b"10")), client.receive, client.send, 10, openai=True
        )
        assert bounded is not None
        receive, _ = bounded
        return [await receive(), await receive(), await receive()]

    assert asyncio.run(run()) == [
        chunk(b"12345", True), chunk(b"67890", False), {"type": "http.disconnect"}
    ]  # fmt: skip
    assert client.sent == []


def test_a_declared_length_over_the_limit_is_answered_413_before_a_read():
    client = Client()  # nothing to read: a read would fail

    async def run() -> object:
        return await bound_body(
            scope((b"Content-Length", b"11")), client.receive, client.send, 10, openai=True
        )

    assert asyncio.run(run()) is None
    assert client.sent[0]["status"] == 413
    assert (b"connection", b"close") in client.sent[0]["headers"]
    error = json.loads(client.sent[1]["body"])["error"]
    assert error["code"] == "request_too_large"
    assert set(error) == {"message", "type", "code", "param"}


def test_an_undeclared_body_is_cut_off_once_past_the_limit_and_the_application_told_it_left():
    client = Client(chunk(b"123456", True), chunk(b"789012", True), chunk(b"never read", True))

    async def run() -> list[MutableMapping[str, Any]]:
        bounded = await bound_body(scope(), client.receive, client.send, 10, openai=False)
        assert bounded is not None
        receive, send = bounded
        seen = [await receive(), await receive(), await receive()]
        await send({"type": "http.response.start", "status": 400, "headers": []})  # dropped
        return seen

    first, past, after = asyncio.run(run())
    assert first == chunk(b"123456", True)
    assert past == after == {"type": "http.disconnect"}
    assert len(client.messages) == 1  # the rest was never read
    assert [m.get("status") for m in client.sent] == [413, None]
    assert client.sent[1]["body"].startswith(b"The request body is larger than the limit")
    assert (b"content-type", b"text/plain; charset=utf-8") in client.sent[0]["headers"]


def test_an_answer_already_begun_is_not_interrupted_by_a_413():
    client = Client(chunk(b"123456", True), chunk(b"789012", True))

    async def run() -> None:
        bounded = await bound_body(scope(), client.receive, client.send, 10, openai=True)
        assert bounded is not None
        receive, send = bounded
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        assert await receive() == {"type": "http.disconnect"}

    asyncio.run(run())
    assert [m["status"] for m in client.sent] == [200]


def test_a_length_that_is_not_a_number_is_counted_as_it_arrives():
    assert declared_length(scope((b"content-length", b"ten"))) is None
    assert declared_length(scope((b"content-length", b"10"))) == 10
    assert declared_length(scope()) is None

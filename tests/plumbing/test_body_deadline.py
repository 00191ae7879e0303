"""A request body held to a deadline (plumbing/body_deadline.py), against a scripted ASGI
`receive`: a body that arrives in time passes through unchanged, one that trickles past the
deadline is answered 408 and the application sees the client leave, and once the body is whole
`receive` is the server's own again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

from plumbing.body_deadline import body_deadline


class Client:
    """The server's side of one request: messages sent after the given delays."""

    def __init__(self, *steps: tuple[float, dict[str, Any]]) -> None:
        self.steps = list(steps)
        self.sent: list[MutableMapping[str, Any]] = []

    async def receive(self) -> MutableMapping[str, Any]:
        delay, message = self.steps.pop(0)
        await asyncio.sleep(delay)
        return message

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)


def chunk(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_in_time_passes_through_unchanged():
    client = Client((0, chunk(b'{"a"', True)), (0.01, chunk(b": 1}", False)))

    async def run() -> list[MutableMapping[str, Any]]:
        receive = body_deadline(client.receive, client.send, timeout_s=1.0)
        return [await receive(), await receive()]

    assert asyncio.run(run()) == [chunk(b'{"a"', True), chunk(b": 1}", False)]
    assert client.sent == []


def test_a_body_that_trickles_past_the_deadline_is_answered_408_and_the_client_leaves():
    client = Client((0, chunk(b"{", True)), (0.2, chunk(b"}", False)))

    async def run() -> list[MutableMapping[str, Any]]:
        receive = body_deadline(client.receive, client.send, timeout_s=0.05)
        return [await receive(), await receive()]

    first, second = asyncio.run(run())

    assert first == chunk(b"{", True)
    assert second == {"type": "http.disconnect"}
    start, body = client.sent
    assert start["status"] == 408
    assert (b"connection", b"close") in start["headers"]
    error = json.loads(body["body"])["error"]
    assert error["code"] == "request_timeout"
    assert dict(start["headers"])[b"content-length"] == str(len(body["body"])).encode()


def test_after_the_whole_body_receive_waits_without_a_deadline():
    # A stream waits on receive() for the client's disconnect, for as long as it streams.
    client = Client((0, chunk(b"{}", False)), (0.1, {"type": "http.disconnect"}))

    async def run() -> list[MutableMapping[str, Any]]:
        receive = body_deadline(client.receive, client.send, timeout_s=0.02)
        return [await receive(), await receive()]

    assert asyncio.run(run())[1] == {"type": "http.disconnect"}
    assert client.sent == []

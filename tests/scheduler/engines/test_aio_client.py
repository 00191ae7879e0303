"""The engine's asyncio client against a stand-in that answers over real HTTP: a stream's
events of any size up to the answer limit pass whole (a Responses stream's last event holds
the whole answer), and an answer or event past it ends the call with AnswerTooLarge."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from scheduler.engines.aio_client import AnswerTooLarge, AsyncEngineClient

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def serve(handler: Handler, call: Callable[[AsyncEngineClient], Awaitable[Any]], limit: int):
    """Runs `call` with a client of a stand-in engine whose every POST `handler` answers."""

    async def main() -> Any:
        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        server = TestServer(app)
        await server.start_server()
        client = AsyncEngineClient(
            str(server.make_url("")), connect_timeout_s=2, generate_timeout_s=10,
            max_answer_bytes=limit,
        )  # fmt: skip
        try:
            return await call(client)
        finally:
            await client.close()
            await server.close()

    return asyncio.run(main())


def sse(*frames: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in frames:
            await response.write(frame)
        await response.write_eof()
        return response

    return handler


def completed_event(text_bytes: int) -> bytes:
    event = {"type": "response.completed", "response": {"output_text": "x" * text_bytes}}
    return b"event: response.completed\ndata: " + json.dumps(event).encode() + b"\n\n"


async def all_events(client: AsyncEngineClient) -> list[tuple[bytes, bytes]]:
    return [event async for event in client.events("/v1/responses", {})]


def test_a_responses_event_larger_than_aiohttp_s_default_line_passes_whole() -> None:
    """aiohttp's default buffer refuses lines over 128 KiB ("Chunk too big"): a long
    answer's last event is larger than that."""
    big = completed_event(300 * 1024)
    events = serve(sse(big), all_events, limit=4 * 1024 * 1024)
    assert len(events) == 1
    assert json.loads(events[0][1])["response"]["output_text"] == "x" * 300 * 1024


def test_an_event_past_the_answer_limit_ends_the_call() -> None:
    with pytest.raises(AnswerTooLarge) as caught:
        serve(sse(completed_event(3 * 1024 * 1024)), all_events, limit=1024 * 1024)
    assert caught.value.status_code == 400
    assert "stream it" in caught.value.body


def test_a_chunk_past_the_answer_limit_ends_a_chat_stream() -> None:
    chunk = json.dumps({"choices": [{"delta": {"content": "y" * 2 * 1024 * 1024}}]})

    async def chunks(client: AsyncEngineClient) -> list[bytes]:
        return [data async for data in client.stream("/v1/chat/completions", {})]

    with pytest.raises(AnswerTooLarge):
        serve(sse(b"data: " + chunk.encode() + b"\n\n", b"data: [DONE]\n\n"), chunks, 1024**2)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_whole_answer_past_the_limit_is_refused_without_reading_it_all(chunked: bool) -> None:
    answer = json.dumps({"choices": [{"message": {"content": "z" * 3 * 1024 * 1024}}]})
    sent: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        body = answer.encode()
        if not chunked:
            return web.Response(body=body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            for start in range(0, len(body), 64 * 1024):
                await response.write(body[start : start + 64 * 1024])
                sent.append(64 * 1024)
                await asyncio.sleep(0.001)
        except ConnectionResetError:
            pass
        return response

    async def generate(client: AsyncEngineClient) -> dict[str, Any]:
        return await client.generate("/v1/chat/completions", {})

    with pytest.raises(AnswerTooLarge):
        serve(handler, generate, limit=1024 * 1024)
    if chunked:  # the client read a little past the limit, then left
        assert sum(sent) < 3 * 1024 * 1024


def test_a_whole_answer_within_the_limit_is_read() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"choices": [{"message": {"content": "ok"}}]})

    async def generate(client: AsyncEngineClient) -> dict[str, Any]:
        return await client.generate("/v1/chat/completions", {})

    assert serve(handler, generate, 1024)["choices"][0]["message"]["content"] == "ok"

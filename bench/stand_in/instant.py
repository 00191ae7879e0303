"""An OpenAI-compatible server that answers at once, for `bench/serve_bench.py`'s client ceiling.

The same load client that measures the engine and the platform is pointed at this server: its
throughput here is the most that client can drive on this machine, so a reader can see whether
the client, not the server it measures, was the narrowest stage.

Answers POST /v1/completions and /v1/chat/completions whole or streamed (`"stream": true`:
server-sent events in HTTP chunked encoding, one event per token, `max_tokens` (or
`max_completion_tokens`) tokens, then a usage event and `data: [DONE]`, all written at once)
and GET /v1/models; anything else is a 404 (so `vllm bench serve` skips its /tokenize check).
Every answer's `usage` says 32 prompt tokens. No model, no delay: each distinct answer is
built once and cached.

    python bench/stand_in/instant.py --port 8199 [--model demo]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from functools import cache
from typing import Any

from wire import serve_connection  # run as a script: its folder is on the path

PROMPT_TOKENS = 32
TOKEN = "word "


def usage(tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": tokens,
        "total_tokens": PROMPT_TOKENS + tokens,
    }


def whole_answer(model: str, chat: bool, tokens: int) -> dict[str, Any]:
    text = TOKEN * tokens
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    choice["finish_reason"] = "length"
    return {
        "id": "instant",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(tokens),
    }


def stream_events(model: str, chat: bool, tokens: int) -> list[dict[str, Any]]:
    """One event per token (the last with finish_reason "length"), then the usage event."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    events: list[dict[str, Any]] = []
    for i in range(tokens):
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["delta"] = {"content": TOKEN}
        else:
            choice["text"] = TOKEN
        choice["finish_reason"] = "length" if i == tokens - 1 else None
        events.append({"id": "instant", "object": kind, "model": model, "choices": [choice]})
    events.append({"object": kind, "model": model, "choices": [], "usage": usage(tokens)})
    return events


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@cache
def response(model: str, chat: bool, stream: bool, tokens: int) -> bytes:
    """The whole HTTP response (status line, headers, body) for one kind of request."""
    if not stream:
        body = json.dumps(whole_answer(model, chat, tokens)).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        return head % len(body) + body
    events = [b"data: %s\n\n" % json.dumps(e).encode() for e in stream_events(model, chat, tokens)]
    events.append(b"data: [DONE]\n\n")
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    head += b"transfer-encoding: chunked\r\n\r\n"
    return head + b"".join(http_chunk(e) for e in events) + b"0\r\n\r\n"


def answer(model: str, method: str, path: str, body: bytes) -> bytes:
    if method == "GET" and path == "/v1/models":
        entry = {"id": model, "object": "model", "root": model}
        listing = json.dumps({"object": "list", "data": [entry]}).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        return head % len(listing) + listing
    if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
        request = json.loads(body or b"{}")
        tokens = int(request.get("max_completion_tokens") or request.get("max_tokens") or 16)
        chat = path == "/v1/chat/completions"
        return response(model, chat, bool(request.get("stream")), tokens)
    return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


async def serve(model: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One keep-alive connection: requests in order, each answered at once."""

    async def respond(method: str, path: str, body: bytes) -> bytes:
        return answer(model, method, path, body)

    await serve_connection(reader, writer, respond)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--model", default="demo", help="the model name it lists and answers as")
    args = parser.parse_args()
    server = await asyncio.start_server(
        lambda r, w: serve(args.model, r, w), args.host, args.port, backlog=1024
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop  # the platform's web runs on it too
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())

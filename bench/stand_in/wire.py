"""The HTTP/1.1 both stand-in servers speak: requests read one after another from a
keep-alive connection, each with its body (Content-Length only; the clients never chunk)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Handler = Callable[[str, str, bytes], Awaitable[bytes]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    """The next request's method, path (without its query) and body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    method, path = head[0].split(" ")[:2]
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return method, path.split("?")[0], body


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handle: Handler
) -> None:
    """Answers the connection's requests in order with `handle`'s raw responses."""
    try:
        while True:
            writer.write(await handle(*await read_request(reader)))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

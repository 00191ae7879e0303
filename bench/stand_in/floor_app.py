"""The baseline of `bench/stand_in_overhead.py`: an ASGI app that answers every request after
FLOOR_DELAY_S with a body the size of a chat answer, under the same server as the platform's
web. Its CPU per request is the server's own floor (HTTP, uvicorn, asyncio)."""

import asyncio
import json
import os

DELAY_S = float(os.environ.get("FLOOR_DELAY_S", "1.0"))
BODY = json.dumps({"id": "floor", "choices": [{"message": {"content": "word " * 64}}]}).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(DELAY_S)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})

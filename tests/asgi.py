"""Requests to the web's whole ASGI application (config.asgi), as uvicorn would send them:
the inference endpoints are an ASGI app in front of Django, which Django's test client does
not reach. Admission's database work runs in a thread pool, so tests that need rows to be
seen there use the `transactional_db` fixture."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx


def asgi_request(method: str, path: str, **kwargs: Any) -> httpx.Response:
    from config.asgi import application

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(send())

"""Generation calls to a vLLM engine from an event loop: the dispatcher's (workers/dispatch.py).

A worker process holds as many engine calls at once as its engines have seats (hundreds on a
GPU), streams included, on one event loop: a thread per call could not follow an engine's
batch. aiohttp is the client (vLLM's own benchmark client uses it); one session per event
loop and engine address keeps its connections alive between calls. Errors are those of
`scheduler.engines.client` (EngineUnavailable: cannot reach it, or it failed; and
EngineRequestError: it refused the request), worded the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from plumbing import wire
from scheduler.engines.client import EngineUnavailable, raise_for_status

# Below the engines' own keep-alive (uvicorn's 5 s in vLLM's server): a connection the engine
# closed while idle is never reused, so a request is never lost on one.
KEEPALIVE_S = 3.0


class AsyncEngineClient:
    """One engine's generation endpoints, for the event loop it was made on."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        generate_timeout_s: float,
        api_key: str | None = None,
    ):
        """`api_key`: the engine's (scheduler.engines.auth), sent on every call."""
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=generate_timeout_s
        )
        # No limit on connections: the fair queue decides how many calls run (an engine's
        # seats), not the client.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            timeout=self._timeout,
            json_serialize=wire.dumps,
            skip_auto_headers=("User-Agent",),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        )

    async def close(self) -> None:
        await self._session.close()

    async def generate(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `path` (not streamed); the OpenAI-shaped answer."""
        url = self.base_url + path
        try:
            async with self._session.post(url, data=wire.dumps_bytes(body), headers=_JSON) as r:
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
        raise_for_status(r.status, text, url)
        answer: dict[str, Any] = wire.loads(text)
        return answer

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """The chunks of a streamed answer (each one's JSON, as the engine sent it), until
        `[DONE]`. Leaving the iteration early closes the connection, which makes vLLM abort
        the request."""
        url = self.base_url + path
        try:
            async with self._session.post(url, data=wire.dumps_bytes(body), headers=_JSON) as r:
                if r.status >= 400:
                    raise_for_status(r.status, await r.text(), url)
                async for line in r.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    yield data
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
        # A stream that ends without [DONE] was cut (an engine killed between two chunks can
        # close the connection in a way the HTTP parser takes for the body's end): its
        # partial answer must not pass for a whole one.
        raise EngineUnavailable(f"{url}: the stream ended without [DONE]")

    async def events(self, path: str, body: dict[str, Any]) -> AsyncIterator[tuple[bytes, bytes]]:
        """A Responses stream's events: (the event as the engine wrote it, `event:` line and
        `data:` line, without the blank line that ends it; its JSON). Such a stream has no
        `[DONE]`: it ends after its last event, which the caller checks it has seen
        (`scheduler.engines.calls.ResponseEvents`). Leaving early aborts the request."""
        url = self.base_url + path
        try:
            async with self._session.post(url, data=wire.dumps_bytes(body), headers=_JSON) as r:
                if r.status >= 400:
                    raise_for_status(r.status, await r.text(), url)
                name = b""
                async for line in r.content:
                    if line.startswith(b"event:"):
                        name = line.rstrip(b"\r\n")
                    elif line.startswith(b"data:"):
                        data = line[5:].strip()
                        yield (name + b"\n" if name else b"") + b"data: " + data, data
                        name = b""
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc


_JSON = {"Content-Type": "application/json"}

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
from aiohttp.http_exceptions import LineTooLong

from plumbing import wire
from scheduler.engines.client import EngineRequestError, EngineUnavailable, raise_for_status

# Below the engines' own keep-alive (uvicorn's 5 s in vLLM's server): a connection the engine
# closed while idle is never reused, so a request is never lost on one.
KEEPALIVE_S = 3.0
# The most one answer (not streamed), or one event of a stream, may take unless the caller
# says otherwise: a Responses stream's last event holds the whole answer.
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class AnswerTooLarge(EngineRequestError):
    """The engine's answer (or one event of its stream) passed the most the platform holds
    of one: the call is ended, which makes vLLM abort the request."""

    def __init__(self, limit: int) -> None:
        message = (
            f"The answer passed the platform's limit of {limit // (1024 * 1024)} MiB for one "
            "answer or stream event; ask for fewer sequences, tokens or logprobs, or stream it."
        )
        super().__init__(message, status_code=400, body=message)


class AsyncEngineClient:
    """One engine's generation endpoints, for the event loop it was made on."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        generate_timeout_s: float,
        api_key: str | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ):
        """`api_key`: the engine's (scheduler.engines.auth), sent on every call.
        `max_answer_bytes`: the most an answer not streamed, or one event of a stream, may
        take (AnswerTooLarge past it)."""
        self.base_url = base_url.rstrip("/")
        self.max_answer_bytes = max_answer_bytes
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
            # A stream's line may take up to twice this (aiohttp's high-water mark); a longer
            # one is a ValueError, answered as AnswerTooLarge.
            read_bufsize=max(2**16, max_answer_bytes // 2),
        )

    async def close(self) -> None:
        await self._session.close()

    async def generate(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """POST `path` (not streamed); the OpenAI-shaped answer. `headers`: more to send
        (a trace's `traceparent`)."""
        url = self.base_url + path
        try:
            async with self._session.post(
                url, data=wire.dumps_bytes(body), headers=_with(headers)
            ) as r:
                raw = await self._read_whole(r)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
        raise_for_status(r.status, raw.decode("utf-8", "replace"), url)
        answer: dict[str, Any] = wire.loads(raw)
        return answer

    async def control(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        """POST a control call (an adapter's load or unload): its status and body, as the
        engine answered; EngineUnavailable where it could not be reached."""
        url = self.base_url + path
        try:
            async with self._session.post(
                url, data=wire.dumps_bytes(body), headers=_with(None)
            ) as r:
                return r.status, (await r.read()).decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc

    async def _read_whole(self, response: aiohttp.ClientResponse) -> bytes:
        """The body, refused past `max_answer_bytes` before more of it is read (leaving the
        call closes its connection: vLLM aborts the request)."""
        limit = self.max_answer_bytes
        if (response.content_length or 0) > limit:
            raise AnswerTooLarge(limit)
        body = bytearray()
        async for piece in response.content.iter_any():
            body += piece
            if len(body) > limit:
                raise AnswerTooLarge(limit)
        return bytes(body)

    async def stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        """The chunks of a streamed answer (each one's JSON, as the engine sent it), until
        `[DONE]`. Leaving the iteration early closes the connection, which makes vLLM abort
        the request."""
        url = self.base_url + path
        try:
            async with self._session.post(
                url, data=wire.dumps_bytes(body), headers=_with(headers)
            ) as r:
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
        except _LINE_TOO_LONG as exc:  # a line over twice the read buffer
            raise AnswerTooLarge(self.max_answer_bytes) from exc
        # A stream that ends without [DONE] was cut (an engine killed between two chunks can
        # close the connection in a way the HTTP parser takes for the body's end): its
        # partial answer must not pass for a whole one.
        raise EngineUnavailable(f"{url}: the stream ended without [DONE]")

    async def events(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        """A Responses stream's events: (the event as the engine wrote it, `event:` line and
        `data:` line, without the blank line that ends it; its JSON). Such a stream has no
        `[DONE]`: it ends after its last event, which the caller checks it has seen
        (`scheduler.engines.calls.ResponseEvents`). Leaving early aborts the request."""
        url = self.base_url + path
        try:
            async with self._session.post(
                url, data=wire.dumps_bytes(body), headers=_with(headers)
            ) as r:
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
        except _LINE_TOO_LONG as exc:  # as in `stream`
            raise AnswerTooLarge(self.max_answer_bytes) from exc


_JSON = {"Content-Type": "application/json"}


def _with(headers: dict[str, str] | None) -> dict[str, str]:
    return _JSON if not headers else {**_JSON, **headers}


# What aiohttp raises for a line over its buffer's high-water mark (by version: a ValueError,
# "Chunk too big", or LineTooLong).
_LINE_TOO_LONG = (ValueError, LineTooLong)

"""The OpenAI inference endpoints: chat completions, completions, embeddings and responses.

The inference endpoints are a lean ASGI app that `config/asgi.py` puts in front of Django for
those paths (`inference_app`): a request waits in the fair queue and then streams, and
holds no thread meanwhile. They skip Django's request handling on purpose: Django runs each
middleware that is not natively async (sessions, CSRF, auth, messages, ...) through a hop to
a thread and back, in a thread made for each request, and closes each response through one
more; on this path that would be half of the web's CPU per request, for middleware a
bearer-key JSON API does not use (docs/decisions/0008-the-request-path-spends-cpu-once.md).
Nothing here blocks the event loop: Redis is asked through an asyncio client, and the
database and other synchronous work run in a thread pool (`scheduler.online.admission`).

Errors are OpenAI-shaped, always.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Mapping,
    MutableMapping,
)
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError

from plumbing import wire
from plumbing.errors import DomainError, openai_error_body
from protocol.inference import Endpoint, InvalidRequest, parse_inference_request
from scheduler.online import admission as online
from telemetry.exporter import rejection_hook
from tenants.models import ApiKey

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

INFERENCE_PATHS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}

# Redis (the queue) or the database not answering: the client can retry, so 503, never 500.
DEPENDENCY_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, DatabaseError)


def dependency_down(exc: Exception) -> online.Unavailable:
    log.warning("online path: a dependency is down: %s: %s", type(exc).__name__, exc)
    return online.Unavailable(
        "The platform's queue or database is not answering; please retry shortly.",
        code="service_unavailable",
        headers={"Retry-After": "5"},
    )


class MethodNotAllowed(DomainError):
    http_status = 405
    code = "method_not_allowed"


@dataclass
class Reply:
    """An HTTP answer: a whole body, or a stream of server-sent events."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: AsyncGenerator[bytes, None] | None = None


def json_reply(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    body = wire.dumps_bytes(payload)
    return Reply(status, {"Content-Type": "application/json", **(headers or {})}, body)


def error_reply(exc: DomainError) -> Reply:
    body = openai_error_body(exc.message, exc.error_type, exc.code, exc.param)
    return json_reply(body, exc.http_status, exc.headers)


# --- the ASGI side ------------------------------------------------------------------------


# Where the gate leaves the key it checked, for the request's handler.
API_KEY_SCOPE = "gpushare.api_key"


async def tenant_key_gate(scope: Scope, send: Send) -> bool:
    """Whether a request to the tenant API (/v1/) may go on to read its body: an unknown,
    revoked or missing key is answered 401 first, so that nobody without a key makes the
    web read (or Django spool) a body of up to the size limit. Every method is checked: a
    GET or a DELETE may carry a body too, and any request may declare none (chunked)."""
    if not scope["path"].startswith("/v1/"):
        return True
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    authorization = headers.get("authorization", "")
    try:
        scope[API_KEY_SCOPE] = await online.authenticate(authorization)
        return True
    except DomainError as exc:
        endpoint = INFERENCE_PATHS.get(scope["path"])
        if endpoint is not None:  # counted as the endpoint's refusals are
            await rejection_hook(
                authorization=authorization,
                request_class=headers.get("x-request-class", "").strip().lower(),
                endpoint=endpoint,
                exc=exc,
            )
        await _send_reply(send, error_reply(exc))
    except DEPENDENCY_ERRORS as exc:
        await _send_reply(send, error_reply(dependency_down(exc)))
    return False


async def inference_app(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /v1/chat/completions, /v1/completions and /v1/responses. A client that goes away
    cancels its request: its job leaves the queue, or its engine stops generating for
    nobody."""
    endpoint = INFERENCE_PATHS[scope["path"]]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    if scope["method"] != "POST":
        method = scope["method"]
        await _send_reply(
            send, error_reply(MethodNotAllowed(f"{method} is not allowed; use POST."))
        )
        return
    try:
        body = await _read_body(receive, headers.get("content-length"))
    except online.RequestTooLarge as exc:
        await _send_reply(send, error_reply(exc))
        return
    if body is None:  # the client left before it finished sending: nobody to answer
        return
    client_gone = asyncio.Event()
    api_key = scope.get(API_KEY_SCOPE)
    answer = asyncio.ensure_future(_answer(endpoint, body, headers, send, client_gone, api_key))
    gone = asyncio.ensure_future(_disconnected(receive))
    await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not answer.done():  # the client left first: stop waiting or streaming for it
        # The flag as well as the cancellation: a client library that swallows a
        # cancellation landing in a blocking read (redis-py's asyncio client did, in BLPOP)
        # would let the relay run to the end for nobody. The flag stops it at its next event.
        client_gone.set()
        answer.cancel()
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await answer


async def _read_body(receive: Receive, content_length: str | None) -> bytes | None:
    """The whole body, or None when the client disconnected first. A declared length over
    the limit is refused before reading; an undeclared one as soon as it passes the limit.
    (The ASGI server has checked that Content-Length is a number.)"""
    online.check_body_size(int(content_length or 0))
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        online.check_body_size(size)
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(
    endpoint: Endpoint,
    body: bytes,
    headers: Mapping[str, str],
    send: Send,
    client_gone: asyncio.Event,
    api_key: ApiKey | None,
) -> None:
    await _send_reply(send, await inference(endpoint, body, headers, client_gone, api_key))


async def _send_reply(send: Send, reply: Reply) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    headers.append((b"x-content-type-options", b"nosniff"))
    if reply.stream is None:
        headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if reply.stream is None:
        await send({"type": "http.response.body", "body": reply.body})
        return
    try:
        async for chunk in reply.stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:  # also when cancelled between two chunks: the stream's cleanup runs now
        await reply.stream.aclose()


# --- the request, whatever serves it -----------------------------------------------------


async def inference(
    endpoint: Endpoint,
    body: bytes,
    headers: Mapping[str, str],
    client_gone: asyncio.Event,
    api_key: ApiKey | None = None,
) -> Reply:
    """Admits one chat, completion or Responses request and answers it (or starts its stream);
    `client_gone` stops the waiting or the stream (see `online.follow`). `api_key`: the
    header's key where `tenant_key_gate` checked it; its tenant's optional request fields
    (protocol/fields.py) are allowed."""
    enabled = api_key.tenant.enabled_fields if api_key is not None else ()
    try:
        parsed = parse_inference_request(
            endpoint,
            online.parse_json_body(body),
            enabled,
            settings.GPUSHARE_MAX_SEQUENCES_PER_REQUEST,
        )
        admitted = await online.admit(
            authorization=headers.get("authorization", ""),
            request=parsed,
            class_header=headers.get("x-request-class", "").strip().lower(),
            api_key=api_key,
        )
        if parsed.stream:
            return Reply(
                200,
                {
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",  # proxies must not hold the stream back
                    **_admitted_headers(admitted),
                },
                stream=_sse(admitted, client_gone),
            )
        return await _whole(admitted, client_gone)
    except InvalidRequest as exc:
        return error_reply(online.BadRequest(exc.message, param=exc.param, code=exc.code))
    except DomainError as exc:
        await rejection_hook(
            authorization=headers.get("authorization", ""),
            request_class=headers.get("x-request-class", "").strip().lower(),
            endpoint=endpoint,
            exc=exc,
        )
        return error_reply(exc)
    except DEPENDENCY_ERRORS as exc:
        return error_reply(dependency_down(exc))


def _admitted_headers(admitted: online.Admitted) -> dict[str, str]:
    """The headers of an admitted request's answer: its job's id, and its tenant's
    x-ratelimit-* (OpenAI's), where the tenant has minute limits."""
    return {"X-Request-Id": admitted.job.job_id, **admitted.rate_limits}


async def _whole(admitted: online.Admitted, client_gone: asyncio.Event) -> Reply:
    finished = False
    try:
        async for event in online.follow(admitted, client_gone):
            kind = event["event"]
            if kind == "done":
                finished = True
                return json_reply(event["body"], headers=_admitted_headers(admitted))
            if kind == "error":
                finished = True
                status = int(event.get("status", 500))
                return json_reply(event["body"], status, _admitted_headers(admitted))
            if kind == "expired":
                finished = True
                return error_reply(online.expired_error(admitted))
            if kind == "cancelled":
                finished = True
                return error_reply(online.Unavailable("The request was cancelled."))
        raise online.Unavailable("The request ended without an answer.")
    finally:  # also when the task is cancelled: the cancel is a task of its own
        if not finished:
            online.cancel(admitted, "client_gone")


def _sse_data(payload: Any) -> bytes:
    return b"data: " + wire.dumps_bytes(payload) + b"\n\n"


@dataclass(frozen=True)
class _Framing:
    """How a stream's events are written: before each chunk the engine wrote, after the
    last, and an error (an OpenAI error body)."""

    chunk: bytes
    end: bytes
    error: Callable[[dict[str, Any]], bytes]


def _response_error(body: dict[str, Any]) -> bytes:
    """A Responses stream's `error` event: OpenAI's fields (code, message, param), and the
    error body whole, which the `openai` client raises as an APIError."""
    error = body["error"]
    data = {"type": "error", "code": error.get("code"), "message": error.get("message"),
            "param": error.get("param"), "error": error}  # fmt: skip
    return b"event: error\n" + _sse_data(data)


# Chat and completions: `data:` lines of chunks, then `data: [DONE]`. Responses: each event as
# the engine wrote it, its `event:` line with it (scheduler.engines.aio_client.events), and
# no [DONE], as OpenAI's.
CHAT_FRAMING = _Framing(b"data: ", b"data: [DONE]\n\n", _sse_data)
RESPONSE_FRAMING = _Framing(b"", b"", _response_error)


async def _sse(
    admitted: online.Admitted, client_gone: asyncio.Event
) -> AsyncGenerator[bytes, None]:
    """The engine's chunks as OpenAI SSE, ending with `data: [DONE]` (a Responses stream: its
    events, see RESPONSE_FRAMING). A run that is lost after chunks were sent cannot be
    resumed invisibly: the stream ends with an error."""
    finished = False
    sent_chunks = 0  # chunks the client has (about one token each)
    framing = RESPONSE_FRAMING if admitted.request.endpoint == "responses" else CHAT_FRAMING
    try:
        async for event in online.follow(admitted, client_gone):
            kind = event["event"]
            if kind == "chunk":  # as the engine wrote it (see scheduler.engines.calls.client_data)
                seq = event.get("seq")  # a relayed chunk's place (fairqueue.inbox.chunk_entry)
                if seq is not None and seq <= sent_chunks:
                    continue  # handed over again (a Redis failover): the client has it
                if seq is not None and seq != sent_chunks + 1:
                    yield framing.error(_lost_chunks(admitted, cancel=True))
                    break
                sent_chunks += 1
                yield framing.chunk + event["raw"] + b"\n\n"
            elif kind == "requeued" and sent_chunks:
                online.cancel(admitted, "stream_broken")
                online.record_broken_stream(admitted, sent_chunks)
                yield framing.error(_stream_error("The engine was lost mid-stream; please retry."))
                break
            elif kind in ("error", "expired", "cancelled"):
                yield framing.error(_event_error(admitted, event))
                break
            elif kind == "done":
                if event.get("chunks", sent_chunks) != sent_chunks:  # its last ones were lost
                    yield framing.error(_lost_chunks(admitted, cancel=False))
                break
        finished = True
        if framing.end:
            yield framing.end
    except DomainError as exc:
        finished = True
        yield framing.error(openai_error_body(exc.message, exc.error_type, exc.code, exc.param))
        if framing.end:
            yield framing.end
    except DEPENDENCY_ERRORS as exc:
        finished = True  # nothing to cancel where the queue is gone; the reaper frees the rest
        down = dependency_down(exc)
        yield framing.error(openai_error_body(down.message, down.error_type, down.code))
        if framing.end:
            yield framing.end
    except (asyncio.CancelledError, GeneratorExit):
        raise
    finally:
        if not finished:
            online.cancel(admitted, "client_gone")


def _lost_chunks(admitted: online.Admitted, *, cancel: bool) -> dict[str, Any]:
    """A relayed stream that lost chunks on their way (a Redis failover): it cannot go on as
    if whole. `cancel`: the run is still going, and is stopped. The run writes its own
    ledger row, as any run that ended or was cancelled does."""
    if cancel:
        online.cancel(admitted, "stream_broken")
    return _stream_error("Part of the stream was lost on its way; please retry.")


def _stream_error(message: str, code: str = "engine_unavailable") -> dict[str, Any]:
    return openai_error_body(message, "server_error", code)


def _event_error(admitted: online.Admitted, event: dict[str, Any]) -> dict[str, Any]:
    if event["event"] == "error":
        body: dict[str, Any] = event["body"]
        return body
    if event["event"] == "expired":
        exc = online.expired_error(admitted)
        return openai_error_body(exc.message, exc.error_type, exc.code)
    return _stream_error("The request was cancelled.", "cancelled")

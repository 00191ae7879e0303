"""The OpenAI-compatible API: models, chat completions and completions.

Chat and completions are async views: a request waits in the fair queue and then streams,
and an async view holds no thread meanwhile. Errors are OpenAI-shaped, always.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import wraps
from typing import Any

import redis
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from config.errors import DomainError, openai_error_body
from config.metrics import rejection_hook
from scheduler import online
from scheduler.inference import Endpoint, InvalidRequest, parse_inference_request
from scheduler.models import EngineStatus
from scheduler.selectors import engine_list
from tenants.auth import TenantApiView

log = logging.getLogger(__name__)

View = Callable[[HttpRequest], Coroutine[Any, Any, HttpResponseBase]]


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


def error_response(exc: DomainError) -> JsonResponse:
    body = openai_error_body(exc.message, exc.error_type, exc.code, exc.param)
    response = JsonResponse(body, status=exc.http_status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def openai_endpoint(view: View) -> View:
    """POST only, no CSRF (bearer keys, not cookies), domain errors as OpenAI errors."""

    @wraps(view)
    async def wrapper(request: HttpRequest) -> HttpResponseBase:
        if request.method != "POST":
            return error_response(MethodNotAllowed(f"{request.method} is not allowed; use POST."))
        try:
            return await view(request)
        except InvalidRequest as exc:
            return error_response(online.BadRequest(exc.message, param=exc.param, code=exc.code))
        except DomainError as exc:
            await rejection_hook(request, exc)
            return error_response(exc)
        except DEPENDENCY_ERRORS as exc:
            return error_response(dependency_down(exc))

    return csrf_exempt(wrapper)


async def _inference(request: HttpRequest, endpoint: Endpoint) -> HttpResponseBase:
    online.check_body_size(request.META.get("CONTENT_LENGTH"))
    body = request.body
    online.check_body_size(None, body)
    parsed = parse_inference_request(endpoint, online.parse_json_body(body))
    admitted = await online.admit(
        authorization=request.headers.get("Authorization", ""),
        request=parsed,
        class_header=request.headers.get("X-Request-Class", "").strip().lower(),
    )
    if parsed.stream:
        response = StreamingHttpResponse(_sse(admitted), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # proxies must not hold the stream back
        response["X-Request-Id"] = admitted.job.job_id
        return response
    return await _whole(admitted)


async def _whole(admitted: online.Admitted) -> HttpResponseBase:
    finished = False
    try:
        async for event in online.follow(admitted):
            kind = event["event"]
            if kind == "done":
                finished = True
                response = JsonResponse(event["body"])
                response["X-Request-Id"] = admitted.job.job_id
                return response
            if kind == "error":
                finished = True
                return JsonResponse(event["body"], status=int(event.get("status", 500)))
            if kind == "expired":
                finished = True
                return error_response(online.expired_error(admitted))
            if kind == "cancelled":
                finished = True
                return error_response(online.Unavailable("The request was cancelled."))
        raise online.Unavailable("The request ended without an answer.")
    finally:
        if not finished:
            online.cancel(admitted, "client_gone")


def _sse_data(payload: Any) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _sse(admitted: online.Admitted) -> AsyncIterator[bytes]:
    """The engine's chunks as OpenAI SSE, ending with `data: [DONE]`. A run that is lost
    after chunks were sent cannot be resumed invisibly: the stream ends with an error."""
    finished = False
    sent_chunks = 0  # chunks with content the client has (about one token each)
    try:
        async for event in online.follow(admitted):
            kind = event["event"]
            if kind == "chunk":
                chunk = _client_chunk(event["data"], admitted.request.include_usage)
                if chunk is not None:
                    sent_chunks += 1 if chunk.get("choices") else 0
                    yield _sse_data(chunk)
            elif kind == "requeued" and sent_chunks:
                online.cancel(admitted, "stream_broken")
                online.record_broken_stream(admitted, sent_chunks)
                yield _sse_data(_stream_error("The engine was lost mid-stream; please retry."))
                break
            elif kind in ("error", "expired", "cancelled"):
                yield _sse_data(_event_error(admitted, event))
                break
            elif kind == "done":
                break
        finished = True
        yield b"data: [DONE]\n\n"
    except DomainError as exc:
        finished = True
        yield _sse_data(openai_error_body(exc.message, exc.error_type, exc.code, exc.param))
        yield b"data: [DONE]\n\n"
    except DEPENDENCY_ERRORS as exc:
        finished = True  # nothing to cancel where the queue is gone; the reaper frees the rest
        down = dependency_down(exc)
        yield _sse_data(openai_error_body(down.message, down.error_type, down.code))
        yield b"data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        raise
    finally:
        if not finished:
            online.cancel(admitted, "client_gone")


def _client_chunk(chunk: dict[str, Any], include_usage: bool) -> dict[str, Any] | None:
    """The platform always asks the engine for usage (to charge real tokens); a client that
    did not ask for it gets chunks without it, as from OpenAI."""
    if include_usage:
        return chunk
    if not chunk.get("choices") and chunk.get("usage"):
        return None
    return {k: v for k, v in chunk.items() if k != "usage"}


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


@openai_endpoint
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    return await _inference(request, "chat")


@openai_endpoint
async def completions(request: HttpRequest) -> HttpResponseBase:
    return await _inference(request, "completions")


class ModelOutput(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.CharField(default="model")
    created = serializers.IntegerField()
    owned_by = serializers.CharField()


def _visible_models(request: Request, view: TenantApiView) -> list[dict[str, Any]]:
    tenant = view.principal.tenant
    engines = engine_list(status=EngineStatus.READY).filter(
        dedicated_tenant__isnull=True
    ) | engine_list(status=EngineStatus.READY).filter(dedicated_tenant=tenant)
    names: dict[str, int] = {}
    for engine in engines:
        started = int(engine.started_at.timestamp()) if engine.started_at else int(time.time())
        if tenant.allows_model(engine.served_model_name):
            names.setdefault(engine.served_model_name, started)
    return [
        {"id": name, "object": "model", "created": created, "owned_by": "gpushare"}
        for name, created in sorted(names.items())
    ]


class ModelListApi(TenantApiView):
    """`GET /v1/models`: the models this tenant may use that have a ready engine."""

    @extend_schema(responses=ModelOutput(many=True))
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": _visible_models(request, self)})


class ModelDetailApi(TenantApiView):
    @extend_schema(responses=ModelOutput)
    def get(self, request: Request, model: str) -> Response:
        for entry in _visible_models(request, self):
            if entry["id"] == model:
                return Response(entry)
        raise online.ModelNotFound(f"The model '{model}' does not exist.", param="model")

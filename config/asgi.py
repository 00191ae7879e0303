"""The web's ASGI application: the OpenAI inference endpoints (lean, see
`api.inference.inference_app`) in front of Django, which serves everything else.

Before either reads a byte of a body, every request is held to a deadline for its body
(`plumbing.body_deadline`), a tenant API request to a live key (`tenant_key_gate`), and every
request to a size for its body by route (`plumbing.body_limit`, `body_limit_of`).

Where tracing is on (`tracing.setup`), each HTTP request is a server span of OpenTelemetry's
ASGI middleware, around all of that."""

import functools
import os
from typing import Any

from django.core.asgi import get_asgi_application

from tracing import spans
from tracing.setup import asgi_traced, configure, instrument_django, provider

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

configure("web")
instrument_django()  # before Django loads its middleware
django_application = get_asgi_application()  # sets Django up: import apps' modules after it

from django.conf import settings  # noqa: E402

from api.inference import INFERENCE_PATHS, inference_app, tenant_key_gate  # noqa: E402
from plumbing.body_deadline import body_deadline  # noqa: E402
from plumbing.body_limit import bound_body  # noqa: E402
from plumbing.request_ids import request_id_scope, with_request_id  # noqa: E402

UPLOAD_PATH = "/v1/files"
# What a multipart upload adds to its file: the boundaries, each part's headers (the file's
# name among them) and the `purpose` field.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


def body_limit_of(scope: Any) -> int:
    """The most bytes of body the request's route reads: the inference endpoints' JSON
    (GPUSHARE_MAX_BODY_BYTES), a batch input's upload (GPUSHARE_BATCH_MAX_FILE_BYTES and its
    multipart framing), and for everything else (the tenant API's other calls, the admin API,
    the console's and Django admin's forms, login included) GPUSHARE_MAX_OTHER_BODY_BYTES."""
    if scope["method"] == "POST" and scope["path"] in INFERENCE_PATHS:
        return int(settings.GPUSHARE_MAX_BODY_BYTES)
    if scope["method"] == "POST" and scope["path"] == UPLOAD_PATH:
        return int(settings.GPUSHARE_BATCH_MAX_FILE_BYTES) + MULTIPART_OVERHEAD_BYTES
    return int(settings.GPUSHARE_MAX_OTHER_BODY_BYTES)


# Any: Django's handler and ASGI servers each type the three a little differently.
async def application(scope: Any, receive: Any, send: Any) -> None:
    if spans.enabled() and scope["type"] == "http":
        await _traced_application()(scope, receive, send)
    else:
        await _served(scope, receive, send)


@functools.cache
def _traced(_provider: Any) -> Any:
    return asgi_traced(_served)


def _traced_application() -> Any:
    """`_served` under the ASGI middleware of the provider installed now."""
    return _traced(provider())


async def _served(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"].startswith("/v1/"):
        with request_id_scope() as request_id:  # see plumbing.request_ids
            await _application(scope, receive, with_request_id(send, request_id))
    else:
        await _application(scope, receive, send)


async def _application(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        receive = body_deadline(receive, send, float(settings.GPUSHARE_BODY_TIMEOUT_S))
        if not await tenant_key_gate(scope, send):
            return  # refused before its body was read
        openai = scope["path"].startswith("/v1/")
        bounded = await bound_body(scope, receive, send, body_limit_of(scope), openai=openai)
        if bounded is None:
            return  # its declared length is over the limit: refused before it was read
        receive, send = bounded
    if scope["type"] == "http" and scope["path"] in INFERENCE_PATHS:
        await inference_app(scope, receive, send)
    else:
        await django_application(scope, receive, send)

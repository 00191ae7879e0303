"""The web's ASGI application: the OpenAI inference endpoints (lean, see
`api.inference.inference_app`) in front of Django, which serves everything else."""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_application = get_asgi_application()  # sets Django up: import apps' modules after it

from django.conf import settings  # noqa: E402

from api.inference import INFERENCE_PATHS, inference_app, tenant_key_gate  # noqa: E402
from plumbing.body_deadline import body_deadline  # noqa: E402
from plumbing.request_ids import request_id_scope, with_request_id  # noqa: E402


# Any: Django's handler and ASGI servers each type the three a little differently.
async def application(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"].startswith("/v1/"):
        with request_id_scope() as request_id:  # see plumbing.request_ids
            await _application(scope, receive, with_request_id(send, request_id))
    else:
        await _application(scope, receive, send)


async def _application(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        receive = body_deadline(receive, send, float(settings.GPUSHARE_BODY_TIMEOUT_S))
    if scope["type"] == "http" and not await tenant_key_gate(scope, send):
        return  # refused before its body was read
    if scope["type"] == "http" and scope["path"] in INFERENCE_PATHS:
        await inference_app(scope, receive, send)
    else:
        await django_application(scope, receive, send)

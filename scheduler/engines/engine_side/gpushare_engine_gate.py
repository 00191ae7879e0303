"""The gate in front of every route of a vLLM engine the platform starts: a caller without
the engine's key gets 401, whatever the path, except `/health`.

vLLM's own key check (`VLLM_API_KEY`, its AuthenticationMiddleware) guards only the paths
under its API prefixes (/v1, /v2, /inference, /cohere) and lets every OPTIONS through, so
/invocations, /tokenize, /pooling, /score, /rerank, /classify, /metrics and whatever route
a later vLLM adds would generate, count or report for anyone who reaches the port. This
middleware goes in through vLLM's `--middleware` argument (scheduler/engines/launch.py),
which adds it last, so it wraps the whole application, vLLM's other middleware and
mounted applications (/metrics) included.

`/health` answers anyone: it says only whether the engine is up, and what watches a node
from outside the platform (a load balancer, an orchestrator's liveness probe) asks it
without a key. The path must be exactly `/health`; anything else needs the key. `/metrics`
also answers the scrape token `GPUSHARE_ENGINE_METRICS_TOKEN` where the engine has one:
Prometheus scrapes vLLM's own series with it, and it opens nothing else.

The key is the one vLLM reads, `VLLM_API_KEY` in the engine's environment; it is compared
by its SHA-256 digest with `hmac.compare_digest`, so the time a comparison takes says
nothing of how much of a guess was right. An engine started without a key refuses every
call but /health.

This file runs inside the engine's Python, from a directory that holds only it and that
alone is on the engine's PYTHONPATH: it imports the standard library only, never the
platform's packages.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KEY_ENV = "VLLM_API_KEY"
METRICS_TOKEN_ENV = "GPUSHARE_ENGINE_METRICS_TOKEN"
OPEN_PATHS = frozenset({"/health"})
METRICS_PATH = "/metrics"
# Policy violation: a WebSocket refused before it is accepted (the server answers 403).
WS_POLICY_VIOLATION = 1008

_REFUSAL = json.dumps({
    "error": {
        "message": "This engine answers only the platform: a valid engine key is required.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}).encode()  # fmt: skip


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the request's first Authorization header when it is a Bearer one."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class EngineKeyGate:
    """Pure ASGI middleware: every HTTP request and WebSocket but `/health` must bear
    `Authorization: Bearer <VLLM_API_KEY>`."""

    def __init__(
        self, app: ASGIApp, key: str | None = None, metrics_token: str | None = None
    ) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV, "") if key is None else key
        if metrics_token is None:
            metrics_token = os.environ.get(METRICS_TOKEN_ENV, "")
        # No key: no token matches (a digest is never empty), so everything is refused.
        self._key_digest = _digest(key.encode()) if key else b""
        self._metrics_digest = _digest(metrics_token.encode()) if metrics_token else b""

    def allows(self, headers: list[tuple[bytes, bytes]], path: str = "") -> bool:
        token = bearer(headers)
        if token is None:
            return False
        digest = _digest(token)
        # Both compared, each in constant time, whatever the first says.
        key = bool(self._key_digest) & hmac.compare_digest(digest, self._key_digest)
        scrape = bool(self._metrics_digest) & hmac.compare_digest(digest, self._metrics_digest)
        return key or (scrape and path == METRICS_PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            # "lifespan" (start-up and shutdown) comes from the server, not a caller.
            await self.app(scope, receive, send)
            return
        if self.allows(scope.get("headers") or [], scope.get("path") or ""):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION})
            return
        await send({
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_REFUSAL)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": _REFUSAL})

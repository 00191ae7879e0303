"""The one small module that talks to a vLLM engine over HTTP, with timeouts.

Everything else (the supervisor, workers, telemetry, tests) goes through it, so timeouts and
error wording are decided once. Errors are EngineUnavailable (cannot reach it, or it is not
healthy) or EngineRequestError (it answered with an error).

The rare control calls go through httpx; the warm-up's completion and the periodic /health
and /metrics through a small HTTP/1.1 client of our own on a plain socket
(`plumbing.kept_alive_http`), which costs a fraction of httpx's or http.client's CPU per
request. The generation calls of the worker's dispatcher, hundreds at once on an event loop,
are `aio_client`'s.
"""

from __future__ import annotations

from typing import Any

import httpx

from plumbing import wire
from plumbing.kept_alive_http import KeptAliveHttp, Unreachable
from scheduler.engines.metrics import EngineMetrics, parse_engine_metrics


class EngineError(Exception):
    pass


class EngineUnavailable(EngineError):
    pass


class EngineRequestError(EngineError):
    def __init__(self, message: str, *, status_code: int, body: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class EngineClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        generate_timeout_s: float = 300.0,
    ) -> None:
        """`api_key`: the engine's (scheduler.engines.auth), sent on every call."""
        self.base_url = base_url.rstrip("/")
        # Short for control calls; generation may legitimately take minutes to finish, but
        # connecting must still be quick.
        self._control_timeout_s = timeout_s
        self._control_timeout = httpx.Timeout(timeout_s)
        self._generate_timeout = httpx.Timeout(generate_timeout_s, connect=timeout_s)
        # Engines speak plain HTTP (Engine.base_url); no TLS context, whose set-up (loading the
        # CA bundle) costs tens of ms of CPU for every client made.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, verify=False, headers=headers)
        self._kept_alive = KeptAliveHttp(
            self.base_url, timeout_s, generate_timeout_s, api_key=api_key
        )

    def close(self) -> None:
        self._http.close()
        self._kept_alive.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, method: str, path: str, *, timeout: httpx.Timeout, json_body: Any = None
    ) -> httpx.Response:
        try:
            response = self._http.request(method, path, json=json_body, timeout=timeout)
        except httpx.TransportError as exc:
            raise EngineUnavailable(
                f"{self.base_url}{path}: {exc.__class__.__name__}: {exc}"
            ) from exc
        raise_for_status(response.status_code, response.text, f"{self.base_url}{path}")
        return response

    def health(self) -> bool:
        """True when the engine answers /health with 200; never raises."""
        try:
            status, _ = self._kept_alive.get("/health", self._control_timeout_s)
        except Unreachable:
            return False
        return status == 200

    def models(self) -> list[str]:
        body = self._request("GET", "/v1/models", timeout=self._control_timeout).json()
        return [model["id"] for model in body.get("data", [])]

    def metrics_text(self) -> str:
        try:
            status, text = self._kept_alive.get("/metrics", self._control_timeout_s)
        except Unreachable as exc:
            raise EngineUnavailable(str(exc)) from exc
        raise_for_status(status, text, f"{self.base_url}/metrics")
        return text

    def metrics(self) -> EngineMetrics:
        return parse_engine_metrics(self.metrics_text())

    def completion(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/completions (not streamed); returns the OpenAI-shaped body."""
        body = {**payload, "stream": False}
        return self._post_json("/v1/completions", body)

    def embeddings(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/embeddings; returns the OpenAI-shaped body."""
        return self._post_json("/v1/embeddings", payload)

    def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            status, text = self._kept_alive.post(path, body)
        except Unreachable as exc:
            raise EngineUnavailable(str(exc)) from exc
        raise_for_status(status, text, f"{self.base_url}{path}")
        result: dict[str, Any] = wire.loads(text)
        return result


def raise_for_status(status_code: int, body: str, url: str) -> None:
    if status_code < 400:
        return
    if status_code == 401:
        # The engine does not take the platform's key (it was started under another
        # SECRET_KEY, or by something else): no call can run there until it is restarted,
        # and the tenant's request is not what it refused.
        raise EngineUnavailable(
            f"{url} refused the platform's key (401): restart the engine so that it gets "
            "its key from this platform's SECRET_KEY"
        )
    if status_code >= 500:
        raise EngineUnavailable(f"{url} answered {status_code}: {body[:500]}")
    raise EngineRequestError(
        f"{url} answered {status_code}: {body[:500]}", status_code=status_code, body=body
    )

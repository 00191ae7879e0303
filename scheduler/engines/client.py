"""The one small module that talks to a vLLM engine over HTTP, with timeouts.

Everything else (the supervisor, workers, telemetry, tests) goes through it, so timeouts and
error wording are decided once. Errors are EngineUnavailable (cannot reach it, or it is not
healthy) or EngineRequestError (it answered with an error).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

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
        timeout_s: float = 10.0,
        generate_timeout_s: float = 300.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # Short for control calls; generation may legitimately take minutes to finish, but
        # connecting must still be quick.
        self._control_timeout = httpx.Timeout(timeout_s)
        self._generate_timeout = httpx.Timeout(generate_timeout_s, connect=timeout_s)
        # Engines speak plain HTTP (Engine.base_url); no TLS context, whose set-up (loading the
        # CA bundle) costs tens of ms of CPU for every client made.
        self._http = httpx.Client(base_url=self.base_url, transport=transport, verify=False)

    def close(self) -> None:
        self._http.close()

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
        _raise_for_status(response, f"{self.base_url}{path}")
        return response

    def health(self) -> bool:
        """True when the engine answers /health with 200; never raises."""
        try:
            self._request("GET", "/health", timeout=self._control_timeout)
        except EngineError:
            return False
        return True

    def models(self) -> list[str]:
        body = self._request("GET", "/v1/models", timeout=self._control_timeout).json()
        return [model["id"] for model in body.get("data", [])]

    def metrics_text(self) -> str:
        return self._request("GET", "/metrics", timeout=self._control_timeout).text

    def metrics(self) -> EngineMetrics:
        return parse_engine_metrics(self.metrics_text())

    def completion(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/completions (not streamed); returns the OpenAI-shaped body."""
        body = {**payload, "stream": False}
        return self._post_json("/v1/completions", body)

    def chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/chat/completions (not streamed)."""
        body = {**payload, "stream": False}
        return self._post_json("/v1/chat/completions", body)

    def stream_completion(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return self._stream("/v1/completions", payload)

    def stream_chat(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks of a streamed chat completion, as dicts, until `[DONE]`."""
        return self._stream("/v1/chat/completions", payload)

    def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._request("POST", path, timeout=self._generate_timeout, json_body=body)
        result: dict[str, Any] = response.json()
        return result

    def _stream(self, path: str, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        body = {**payload, "stream": True}
        url = f"{self.base_url}{path}"
        try:
            with self._http.stream(
                "POST", path, json=body, timeout=self._generate_timeout
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_status(response, url)
                yield from _sse_events(response.iter_lines())
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc


def _sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _raise_for_status(response: httpx.Response, url: str) -> None:
    if response.status_code < 400:
        return
    body = response.text
    if response.status_code >= 500:
        raise EngineUnavailable(f"{url} answered {response.status_code}: {body[:500]}")
    raise EngineRequestError(
        f"{url} answered {response.status_code}: {body[:500]}",
        status_code=response.status_code,
        body=body,
    )

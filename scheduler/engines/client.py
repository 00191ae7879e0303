"""The one small module that talks to a vLLM engine over HTTP, with timeouts.

Everything else (the supervisor, workers, telemetry, tests) goes through it, so timeouts and
error wording are decided once. Errors are EngineUnavailable (cannot reach it, or it is not
healthy) or EngineRequestError (it answered with an error).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # Short for control calls; generation may legitimately take minutes to finish, but
        # connecting must still be quick.
        self._control_timeout = httpx.Timeout(timeout_s)
        self._generate_timeout = httpx.Timeout(generate_timeout_s, connect=timeout_s)
        # Engines speak plain HTTP (Engine.base_url); no TLS context, whose set-up (loading the
        # CA bundle) costs tens of ms of CPU for every client made.
        self._http = httpx.Client(base_url=self.base_url, verify=False)
        self._posts = _KeptAliveJsonPosts(self.base_url, timeout_s, generate_timeout_s)

    def close(self) -> None:
        self._http.close()
        self._posts.close()

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
        _raise_for_status(response.status_code, response.text, f"{self.base_url}{path}")
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
        status, text = self._posts.post(path, body)
        _raise_for_status(status, text, f"{self.base_url}{path}")
        result: dict[str, Any] = json.loads(text)
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
                    _raise_for_status(response.status_code, response.text, url)
                yield from _sse_events(response.iter_lines(), url)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc


def _sse_events(lines: Iterator[str], url: str) -> Iterator[dict[str, Any]]:
    """The stream's events until `[DONE]`. A stream that ends without it was cut: an engine
    killed between two chunks can close the connection in a way the HTTP parser accepts as
    the body's end (seen in CI), and its partial answer must not pass for a whole one."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)
    raise EngineUnavailable(f"{url}: the stream ended without [DONE]")


def _raise_for_status(status_code: int, body: str, url: str) -> None:
    if status_code < 400:
        return
    if status_code >= 500:
        raise EngineUnavailable(f"{url} answered {status_code}: {body[:500]}")
    raise EngineRequestError(
        f"{url} answered {status_code}: {body[:500]}", status_code=status_code, body=body
    )


# A kept-alive connection the engine closed while it sat idle (uvicorn closes them after a
# few seconds): the request never reached the engine, so it is sent again on a new one.
_STALE_CONNECTION = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class _KeptAliveJsonPosts:
    """Generation requests that are not streamed, over the standard library's http.client
    with one kept-alive connection per thread: a third of httpx's CPU per request (the
    worker's largest share of the platform's CPU per request; bench/online_overhead.py)."""

    def __init__(self, base_url: str, connect_timeout_s: float, read_timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._connect_timeout_s, self._read_timeout_s = connect_timeout_s, read_timeout_s
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        """Sends `body` as JSON; returns the status and the body text."""
        data = json.dumps(body).encode()
        url = f"http://{self._host}:{self._port}{self._prefix}{path}"
        headers = {"Content-Type": "application/json"}
        while True:
            connection, reused = self._connection()
            try:
                connection.request("POST", self._prefix + path, body=data, headers=headers)
                response = connection.getresponse()
                text = response.read().decode("utf-8", errors="replace")
            except _STALE_CONNECTION as exc:
                self._drop(connection)
                if reused:
                    continue
                raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop(connection)
                raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
            if response.will_close:
                self._drop(connection)
            return response.status, text

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None:
            return connection, True
        connection = http.client.HTTPConnection(
            self._host, self._port, timeout=self._connect_timeout_s
        )
        try:
            connection.connect()
        except OSError as exc:
            url = f"http://{self._host}:{self._port}"
            raise EngineUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
        assert connection.sock is not None
        connection.sock.settimeout(self._read_timeout_s)  # generation may take minutes
        self._local.connection = connection
        with self._lock:
            self._all.append(connection)
        return connection, False

    def _drop(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        self._local.connection = None
        with self._lock:
            if connection in self._all:
                self._all.remove(connection)

    def close(self) -> None:
        with self._lock:
            for connection in self._all:
                connection.close()
            self._all.clear()

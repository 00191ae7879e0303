"""A kept-alive HTTP/1.1 client on a plain socket, one connection per thread, for a server
that speaks plain HTTP/1.1 (an engine's uvicorn): JSON POSTs and GETs, the answer's status and
body text. It replaces httpx and http.client on the calls the platform makes most often;
tests/plumbing/test_kept_alive_http.py holds it to httpx's answers.
"""

from __future__ import annotations

import socket
import threading
from io import BufferedReader
from typing import Any
from urllib.parse import urlsplit

from plumbing import wire

# A status or header line longer than this is not an engine's answer (http.client's limits).
_MAX_LINE = 65536
_MAX_HEADERS = 100


class Unreachable(ConnectionError):
    """The server could not be reached, or what it sent is not an HTTP/1.x answer; the message
    names the server and the cause."""


class RemoteDisconnected(ConnectionError):
    """The engine closed the connection without sending a status line (http.client's name)."""


class MalformedResponse(ValueError):
    """What the engine sent is not an HTTP/1.x answer."""


class _Connection:
    """A socket and a buffered reader on it: readline() for the status line and headers,
    read(n) for the body, each one C call over what recv() already brought in."""

    __slots__ = ("closed", "reader", "sock", "timeout_s")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.timeout_s: float | None = None  # as set on the socket
        self.reader = sock.makefile("rb")
        # Seen by the thread that owns it when another thread's close() closed it under it, so
        # that a new one is made, as http.client reconnected a closed HTTPConnection.
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.reader.close()
        self.sock.close()


class KeptAliveHttp:
    """Generation requests that are not streamed (and the periodic GETs of /health and
    /metrics), over a small HTTP/1.1 client of our own on a plain socket, one kept-alive
    connection per thread: the engine call is the worker's largest share of the platform's
    CPU per request. http.client costs a third of httpx's CPU per request, and this under
    half of http.client's (`bench/engine_posts.py` compares them;
    docs/decisions/0008-the-request-path-spends-cpu-once.md): the request goes out as one
    prebuilt buffer, and of the answer's headers only the three that say where the body ends
    and whether the connection stays open are looked at, where http.client parses them all
    with email.parser. Engines speak plain HTTP/1.1 (uvicorn)."""

    def __init__(
        self,
        base_url: str,
        connect_timeout_s: float,
        read_timeout_s: float,
        *,
        api_key: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._connect_timeout_s, self._read_timeout_s = connect_timeout_s, read_timeout_s
        host = f"[{self._host}]" if ":" in self._host else self._host
        if self._port != 80:
            host = f"{host}:{self._port}"
        # http.client's headers too: no Accept-Encoding would allow a compressed answer.
        self._headers = f"Host: {host}\r\nAccept-Encoding: identity\r\n"
        if api_key:
            self._headers += f"Authorization: Bearer {api_key}\r\n"
        self._local = threading.local()
        self._all: list[_Connection] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        """Sends `body` as JSON; returns the status and the body text."""
        data = wire.dumps_bytes(body)
        head = (
            f"POST {self._prefix}{path} HTTP/1.1\r\n{self._headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        # One sendall: a second small write would wait on the engine's delayed ACK.
        return self._exchange(path, b"".join((head.encode("ascii"), data)), self._read_timeout_s)

    def get(self, path: str, timeout_s: float) -> tuple[int, str]:
        """GET `path` (the periodic /health and /metrics); the status and the body text."""
        head = f"GET {self._prefix}{path} HTTP/1.1\r\n{self._headers}\r\n"
        return self._exchange(path, head.encode("ascii"), timeout_s)

    def _exchange(self, path: str, request: bytes, timeout_s: float) -> tuple[int, str]:
        url = f"http://{self._host}:{self._port}{self._prefix}{path}"
        while True:
            connection, reused = self._connection()
            try:
                if connection.timeout_s != timeout_s:
                    connection.sock.settimeout(timeout_s)
                    connection.timeout_s = timeout_s
                try:
                    connection.sock.sendall(request)
                    line = connection.reader.readline(_MAX_LINE + 1)
                    if not line:
                        raise RemoteDisconnected("the engine closed the connection unanswered")
                except (RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    # Closed while it sat idle (uvicorn closes them after a few seconds), before
                    # any byte of the answer: the request never reached the engine, so it is
                    # sent again, once, on a new connection. An error once part of the answer
                    # came is not retried: the engine ran the request.
                    if reused:
                        self._drop(connection)
                        continue
                    raise
                status, content, keep_alive = _read_answer(connection.reader, line)
            except (OSError, ValueError) as exc:  # ValueError: MalformedResponse, a bad number
                self._drop(connection)
                raise Unreachable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
            if not keep_alive:
                self._drop(connection)
            return status, content.decode("utf-8", errors="replace")

    def _connection(self) -> tuple[_Connection, bool]:
        connection: _Connection | None = getattr(self._local, "connection", None)
        if connection is not None and not connection.closed:
            return connection, True
        try:
            sock = socket.create_connection(
                (self._host, self._port), timeout=self._connect_timeout_s
            )
        except OSError as exc:
            url = f"http://{self._host}:{self._port}"
            raise Unreachable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
        # The request is written whole, at once: nothing to gain from Nagle's wait for an ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(sock)  # its timeout is set by each request
        self._local.connection = connection
        with self._lock:
            self._all.append(connection)
        return connection, False

    def _drop(self, connection: _Connection) -> None:
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


def _read_answer(reader: BufferedReader, line: bytes) -> tuple[int, bytes, bool]:
    """The answer whose status line is `line`: its status, its body, and whether the connection
    may carry the next request."""
    while True:
        status, keep_alive = _status(line)
        length, chunked, keep_alive = _headers(reader, keep_alive)
        if not 100 <= status < 200:
            break
        # An interim answer (100 Continue) has no body; the real one follows.
        line = reader.readline(_MAX_LINE + 1)
        if not line:
            raise MalformedResponse(f"the connection closed after a {status} answer")
    if status in (204, 304):  # no body, whatever the headers say
        return status, b"", keep_alive
    if chunked:
        return status, _read_chunked(reader), keep_alive
    if length is None:  # the body is all the engine sends before it closes
        return status, reader.read(), False
    content = reader.read(length)
    if len(content) < length:
        raise MalformedResponse(f"the body ended after {len(content)} of {length} bytes")
    return status, content, keep_alive


def _status(line: bytes) -> tuple[int, bool]:
    """The status code, and whether the connection stays open unless a header says otherwise
    (HTTP/1.1 yes, HTTP/1.0 no)."""
    version, _, rest = line.partition(b" ")
    code = rest[:3]
    if (
        not version.startswith(b"HTTP/1.")
        or len(code) != 3
        or not code.isdigit()
        or rest[3:4] not in b" \r\n"  # after the code: the reason, the line's end, or nothing
        or len(line) > _MAX_LINE
    ):
        raise MalformedResponse(f"not a status line: {line[:100]!r}")
    return int(code), version != b"HTTP/1.0"


def _headers(reader: BufferedReader, keep_alive: bool) -> tuple[int | None, bool, bool]:
    """Reads the headers up to the blank line; only three of them say how to read the body
    and whether the connection stays open: (Content-Length, chunked, keep-alive)."""
    length: int | None = None
    chunked = False
    for _ in range(_MAX_HEADERS + 1):
        line = reader.readline(_MAX_LINE + 1)
        if line == b"\r\n" or line == b"\n":
            return length, chunked, keep_alive
        if not line or len(line) > _MAX_LINE:
            raise MalformedResponse("the headers were cut or a header line is too long")
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            digits = value.strip()
            if not digits.isdigit():  # int() would also take "-1", "+1" and "1_0"
                raise MalformedResponse(f"Content-Length: {digits[:100]!r}")
            length = int(digits)
        elif name == b"transfer-encoding":
            # Chunked is the last coding when present; there is no other way to find the end.
            chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        elif name == b"connection":
            tokens = {token.strip() for token in value.lower().split(b",")}
            if b"close" in tokens:
                keep_alive = False
            elif b"keep-alive" in tokens:
                keep_alive = True
    raise MalformedResponse(f"more than {_MAX_HEADERS} headers")


def _read_chunked(reader: BufferedReader) -> bytes:
    """The body of a chunked answer: its chunks joined, its trailers read and dropped."""
    parts: list[bytes] = []
    while True:
        line = reader.readline(_MAX_LINE + 1)
        size_text = line.split(b";", 1)[0].strip()  # a chunk extension after `;` is ignored
        try:
            size = int(size_text, 16)
        except ValueError:
            size = -1
        if size < 0 or not line.endswith(b"\n"):
            raise MalformedResponse(f"not a chunk size line: {line[:100]!r}")
        if size == 0:
            break
        chunk = reader.read(size)
        if len(chunk) < size or reader.readline(3) not in (b"\r\n", b"\n"):
            raise MalformedResponse("a chunk was cut or not followed by its line end")
        parts.append(chunk)
    # Trailers, skipped up to the blank line that ends the answer.
    for _ in range(_MAX_HEADERS + 1):
        line = reader.readline(_MAX_LINE + 1)
        if line in (b"\r\n", b"\n", b""):
            return b"".join(parts)
    raise MalformedResponse(f"more than {_MAX_HEADERS} trailer lines")

"""The kept-alive HTTP/1.1 client (plumbing/kept_alive_http.py) against httpx, the library it
replaces, on the same real server: the same status and body for GETs and JSON POSTs, answers
framed by Content-Length, chunked or by the connection's close, a connection kept between
calls and made again after the server closed it, and a server that is not there."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from plumbing.kept_alive_http import KeptAliveHttp, Unreachable


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    opened = 0  # connections the server accepted

    def setup(self) -> None:
        super().setup()
        Handler.opened += 1

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes, *, framing: str = "length") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (body[:3], body[3:]):
                if part:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif framing == "close":
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self._answer(200, b'{"parts": 2}', framing="chunked")
        elif self.path == "/close":
            self._answer(200, b'{"closed": true}', framing="close")
        elif self.path == "/missing":
            self._answer(404, b'{"error": "no such path"}')
        else:
            auth = self.headers.get("Authorization", "")
            self._answer(200, json.dumps({"path": self.path, "auth": auth}).encode())

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        received = json.loads(self.rfile.read(length))
        self._answer(201, json.dumps({"echo": received}).encode())


@pytest.fixture
def server() -> Iterator[str]:
    Handler.opened = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("path", ["/health", "/chunked", "/close", "/missing"])
def test_a_get_answers_as_httpx_does(server: str, path: str) -> None:
    client = KeptAliveHttp(server, 5, 5, api_key="k")
    try:
        ours = client.get(path, 5)
    finally:
        client.close()
    theirs = httpx.get(server + path, headers={"Authorization": "Bearer k"})

    assert ours == (theirs.status_code, theirs.text)


def test_a_json_post_answers_as_httpx_does(server: str) -> None:
    body = {"prompt": "héllo", "max_tokens": 3, "nested": {"a": [1, 2.5, None]}}
    client = KeptAliveHttp(server, 5, 5)
    try:
        ours = client.post("/v1/completions", body)
    finally:
        client.close()
    theirs = httpx.post(server + "/v1/completions", json=body)

    assert ours == (theirs.status_code, theirs.text)
    assert json.loads(ours[1]) == {"echo": body}


def test_one_connection_serves_many_calls_and_another_follows_a_close(server: str) -> None:
    client = KeptAliveHttp(server, 5, 5)
    try:
        for _ in range(5):
            assert client.get("/health", 5)[0] == 200
        assert Handler.opened == 1
        assert client.get("/close", 5)[0] == 200  # the server closes this one after answering
        assert client.get("/health", 5)[0] == 200
        assert Handler.opened == 2
    finally:
        client.close()


def test_a_server_that_is_not_there_is_unreachable_with_its_address() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = KeptAliveHttp(f"http://127.0.0.1:{port}", 1, 1)
    with pytest.raises(Unreachable, match=f"127.0.0.1:{port}"):
        client.get("/health", 1)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health")

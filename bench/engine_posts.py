"""The engine client's non-streamed generation requests: the client's own CPU time per request,
`KeptAliveHttp` (our HTTP/1.1 client on a plain socket) against the standard library's
http.client kept alive (what the class used before), in the same run.

Starts a small keep-alive HTTP/1.1 server in a subprocess (its CPU is not counted) that answers
every POST with a vLLM-sized chat completion (~1 KB, Content-Length) under uvicorn's headers
(date, server, content-length, content-type). Then one client thread sends --requests posts
each way, in --rounds alternating rounds, one at a time, and prints the client process's CPU
time per request (time.process_time: only this thread runs) for each way and the ratio new/old.

    .venv/bin/python bench/engine_posts.py --requests 2000 --rounds 4
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import socketserver
import subprocess
import sys
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plumbing.kept_alive_http import KeptAliveHttp

# A way of posting: given the server's URL, a post() that returns (status, text), and a close().
Post = Callable[[], tuple[int, str]]
Way = Callable[[str], tuple[Post, Callable[[], None]]]

PATH = "/v1/chat/completions"
REQUEST = {
    "model": "bench-tiny",
    "messages": [{"role": "user", "content": "Say something about the sea, briefly."}],
    "max_tokens": 64,
    "temperature": 0.7,
    "stream": False,
}
ANSWER = {
    "id": "chatcmpl-3f9a4c1e8b7d4e2a9c0b1d2e3f4a5b6c",
    "object": "chat.completion",
    "created": 1764547200,
    "model": "bench-tiny",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "reasoning_content": None,
                "content": "The sea keeps its own time, " * 20,
                "tool_calls": [],
            },
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
    ],
    "usage": {"prompt_tokens": 17, "total_tokens": 81, "completion_tokens": 64},
    "prompt_logprobs": None,
    "kv_transfer_params": None,
}


class _Handler(socketserver.StreamRequestHandler):
    """Reads each request's head and body, answers with the same prebuilt body."""

    body = json.dumps(ANSWER).encode()

    def handle(self) -> None:
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            line = self.rfile.readline()
            if not line:
                return
            length = 0
            while (line := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            self.rfile.read(length)
            head = (
                f"HTTP/1.1 200 OK\r\ndate: {formatdate(usegmt=True)}\r\nserver: uvicorn\r\n"
                f"content-length: {len(self.body)}\r\ncontent-type: application/json\r\n\r\n"
            )
            self.wfile.write(head.encode() + self.body)


def serve() -> None:
    """The server's process: prints its port, then serves until killed."""
    socketserver.ThreadingTCPServer.daemon_threads = True
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler) as server:
        print(server.server_address[1], flush=True)
        server.serve_forever()


def old_way(base_url: str) -> tuple[Post, Callable[[], None]]:
    """A kept-alive http.client connection, used as the class did before: request,
    getresponse, read, decode."""
    port = int(base_url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json"}

    def post() -> tuple[int, str]:
        data = json.dumps(REQUEST).encode()
        connection.request("POST", PATH, body=data, headers=headers)
        response = connection.getresponse()
        text = response.read().decode("utf-8", errors="replace")
        if response.will_close:
            connection.close()
        return response.status, text

    return post, connection.close


def new_way(base_url: str) -> tuple[Post, Callable[[], None]]:
    posts = KeptAliveHttp(base_url, 10, 300)
    return lambda: posts.post(PATH, REQUEST), posts.close


def run_round(post: Post, n: int, expected: int) -> tuple[float, float]:
    """CPU seconds and wall seconds for `n` posts, one after another."""
    post()  # the connection is made outside the measure
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        status, text = post()
        if status != 200 or len(text) != expected:
            raise RuntimeError(f"unexpected answer: {status}, {len(text)} characters")
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="posts each way, in all")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds each way")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        base_url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        expected = len(_Handler.body)
        print(f"{args.requests} posts each way in {args.rounds} rounds; answer {expected} bytes")
        ways: dict[str, Way] = {"http.client": old_way, "KeptAliveHttp": new_way}
        totals = {name: [0.0, 0.0] for name in ways}
        per_round = args.requests // args.rounds
        for round_index in range(args.rounds):
            order = list(ways) if round_index % 2 == 0 else list(reversed(ways))
            for name in order:
                post, close = ways[name](base_url)
                try:
                    cpu, wall = run_round(post, per_round, expected)
                finally:
                    close()
                totals[name][0] += cpu
                totals[name][1] += wall
                print(
                    f"round {round_index + 1} {name:>20}: {cpu / per_round * 1e6:7.1f} us CPU,"
                    f" {wall / per_round * 1e6:7.1f} us wall per request"
                )
        n = per_round * args.rounds
        old_cpu, new_cpu = totals["http.client"][0] / n, totals["KeptAliveHttp"][0] / n
        print(f"http.client:         {old_cpu * 1e6:7.1f} us CPU per request")
        print(f"KeptAliveHttp: {new_cpu * 1e6:7.1f} us CPU per request")
        print(f"ratio new/old: {new_cpu / old_cpu:.2f}")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()

"""The engine client's generation requests against a small real HTTP server: non-streamed
(our own HTTP/1.1 client, one kept-alive connection per thread) answers, refusals, an engine
that closed an idle connection, an engine that is gone; the ways an HTTP/1.1 answer may be
framed (Content-Length, chunked, until the connection closes, after a 100 Continue, announcing
`Connection: close`, trickled in small TCP writes) and one cut short. Then the dispatcher's
asyncio client: whole answers, refusals, and a stream cut before its end. Last, what the
worker's runner makes of a stream that ends with `[DONE]` but without a finish reason (what a
vLLM server whose engine core died sends)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest.mock import ANY

import pytest
from django.conf import settings

from fairqueue import EnginePolicy, FairQueue, Job, TenantPolicy
from fairqueue.aio import AsyncFairQueue
from plumbing.aio_redis import AsyncRedis
from scheduler.engines.aio_client import AsyncEngineClient
from scheduler.engines.client import EngineClient, EngineRequestError, EngineUnavailable
from scheduler.pools.policies import fair_queue
from workers.runner import Relay, Run, RunResult, run_job

UNIT = 256 * 1024 * 1024


class _Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept-alive connections, as uvicorn serves them
    served: list[dict[str, object]] = []
    peers: list[int] = []  # the client's port for each request: which connection carried it
    close_after_answer = False
    # How a 200 answer is framed: "length" (Content-Length), "chunked", "until_close" (neither:
    # the body ends when the connection does), "continue" (a 100 Continue first), "close"
    # (announces `Connection: close` but leaves the connection open), "cut" (closes mid-body).
    framing = "length"
    trickle = False  # the answer in writes of 1 to 3 bytes, each sent at once (TCP_NODELAY)
    cut_stream = False
    ends_with_a_reason = False  # the last chunk has a finish reason, as a whole answer has
    health_status = 200
    metrics_status = 200
    keys: list[str | None] = []  # each request's Authorization header
    required_key: str | None = None  # what vLLM started with VLLM_API_KEY demands, else 401

    def _refused(self) -> bool:
        _Engine.keys.append(self.headers.get("Authorization"))
        if _Engine.required_key is None or self.path == "/health":
            return False
        if self.headers.get("Authorization") == f"Bearer {_Engine.required_key}":
            return False
        self._answer(401, {"error": "Unauthorized"})
        return True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Engine.served.append(body)
        _Engine.peers.append(self.client_address[1])
        if self._refused():
            return
        if body.get("stream"):
            self._stream()
            return
        if body.get("max_tokens", 0) < 0:
            self._answer(400, {"message": "max_tokens must be at least 1"})
            return
        payload = {"echo": body, "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        if _Engine.framing != "length" or _Engine.trickle:
            self._framed(payload)
            return
        self._answer(200, payload)
        if _Engine.close_after_answer:
            self.close_connection = True  # as an idle keep-alive timeout does, unannounced

    def do_GET(self) -> None:
        _Engine.peers.append(self.client_address[1])
        if self._refused():
            return
        if self.path == "/health":
            self._answer(_Engine.health_status, {})
            return
        text = b"# HELP vllm:num_requests_running x\nvllm:num_requests_running 3.0\n"
        self.send_response(_Engine.metrics_status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)
        if _Engine.close_after_answer:
            self.close_connection = True

    def _answer(self, status: int, payload: dict[str, object]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _framed(self, payload: dict[str, object]) -> None:
        """The answer written out by hand, framed as `_Engine.framing` says."""
        data = json.dumps(payload).encode()
        framing = _Engine.framing
        head = b"HTTP/1.1 200 OK\r\nServer: test\r\nContent-Type: application/json\r\n"
        if framing == "chunked":  # pieces of 7 bytes, an extension on one, and a trailer
            pieces = [data[i : i + 7] for i in range(0, len(data), 7)]
            chunks = [
                b"%x%s\r\n%s\r\n" % (len(p), b";x=1" * (i == 1), p) for i, p in enumerate(pieces)
            ]
            answer = head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(chunks)
            answer += b"0\r\nX-Trailer: t\r\n\r\n"
        elif framing == "until_close":
            answer = head + b"\r\n" + data
            self.close_connection = True
        else:
            length = b"Content-Length: %d\r\n" % len(data)
            answer = head + length + b"\r\n" + data
            if framing == "continue":
                answer = b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n" + answer
            elif framing == "close":
                answer = head + b"Connection: close\r\n" + length + b"\r\n" + data
            elif framing == "cut":
                answer = answer[:-5]
                self.close_connection = True
        if not _Engine.trickle:
            self.wfile.write(answer)
            return
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start, sizes = 0, itertools.cycle((1, 3, 2))
        while start < len(answer):  # each piece its own segment, the client reading meanwhile
            size = next(sizes)
            self.wfile.write(answer[start : start + size])
            self.wfile.flush()
            start += size
            time.sleep(0.0005)

    def _stream(self) -> None:
        """Two chunks, then `[DONE]` unless cut. The body ends when the connection closes
        (no length, not chunked): a close then looks like a whole answer to the parser."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for token, reason in (
            ("Hel", None),
            ("lo", "length" if _Engine.ends_with_a_reason else None),
        ):
            choice = {"index": 0, "delta": {"content": token}, "finish_reason": reason}
            self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        if not _Engine.cut_stream:
            self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    _Engine.served, _Engine.close_after_answer, _Engine.cut_stream = [], False, False
    _Engine.ends_with_a_reason, _Engine.peers = False, []
    _Engine.framing, _Engine.trickle = "length", False
    _Engine.health_status = _Engine.metrics_status = 200
    _Engine.keys, _Engine.required_key = [], None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_chat_is_posted_with_stream_off_and_its_body_returned(engine):
    with EngineClient(engine) as client:
        first = client.completion({"model": "m", "max_tokens": 5, "stream": True})
        second = client.completion({"model": "m", "prompt": "hi", "max_tokens": 5})
    assert first["echo"] == {"model": "m", "max_tokens": 5, "stream": False}
    assert second["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}
    assert len(_Engine.served) == 2


def test_a_refusal_is_the_clients_error_with_the_engines_words(engine):
    with EngineClient(engine) as client, pytest.raises(EngineRequestError) as caught:
        client.completion({"model": "m", "max_tokens": -1})
    assert caught.value.status_code == 400
    assert "max_tokens must be at least 1" in caught.value.body


def test_a_connection_the_engine_closed_while_idle_is_replaced_without_a_second_run(engine):
    _Engine.close_after_answer = True
    with EngineClient(engine) as client:
        for index in range(3):
            assert (
                client.completion({"model": "m", "max_tokens": index})["echo"]["max_tokens"]
                == index
            )
    assert [body["max_tokens"] for body in _Engine.served] == [0, 1, 2]  # each ran once


def test_health_and_metrics_are_read_on_the_kept_alive_connection_of_the_posts(engine):
    with EngineClient(engine) as client:
        assert client.health()
        assert "vllm:num_requests_running 3.0" in client.metrics_text()
        client.completion({"model": "m", "max_tokens": 1})
        assert client.health()
    assert len(set(_Engine.peers)) == 1  # one connection carried all four


def test_an_unhealthy_engine_is_said_so_and_failed_metrics_raise(engine):
    _Engine.health_status, _Engine.metrics_status = 503, 500
    with EngineClient(engine) as client:
        assert client.health() is False
        with pytest.raises(EngineUnavailable, match="500"):
            client.metrics_text()
    _Engine.health_status = 200
    with EngineClient(engine) as client:
        assert client.health()


def test_periodic_gets_survive_the_engine_closing_idle_connections(engine):
    _Engine.close_after_answer = True
    with EngineClient(engine) as client:
        for _ in range(3):
            assert "num_requests_running" in client.metrics_text()
    assert len(set(_Engine.peers)) == 3  # each on a new connection, none failed


def test_health_of_an_engine_that_is_gone_is_false_not_an_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with EngineClient(f"http://127.0.0.1:{port}", timeout_s=1) as client:
        assert client.health() is False


def _chats(engine: str, count: int) -> list[object]:
    """`count` chats through one client, one after another; the max_tokens each answer echoes.
    A short read timeout: a client waiting for an end that never comes fails in seconds."""
    with EngineClient(engine, generate_timeout_s=5) as client:
        return [
            client.completion({"model": "m", "max_tokens": n})["echo"]["max_tokens"]
            for n in range(count)
        ]


def test_a_chunked_answer_is_decoded_and_its_connection_kept(engine):
    _Engine.framing = "chunked"
    assert _chats(engine, 3) == [0, 1, 2]
    assert len(set(_Engine.peers)) == 1  # its end was found where it is: the connection carried on


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_answer_in_many_small_writes_is_read_whole(engine, framing):
    _Engine.framing, _Engine.trickle = framing, True
    assert _chats(engine, 2) == [0, 1]
    assert len(set(_Engine.peers)) == 1


def test_an_answer_that_says_connection_close_is_its_connections_last(engine):
    _Engine.framing = "close"  # the engine leaves the connection open: only the header tells
    assert _chats(engine, 3) == [0, 1, 2]
    assert len(set(_Engine.peers)) == 3


def test_a_body_with_neither_length_nor_chunks_is_read_until_the_connection_closes(engine):
    _Engine.framing = "until_close"
    assert _chats(engine, 2) == [0, 1]
    assert len(_Engine.served) == 2  # each ran once


def test_a_100_continue_before_the_answer_is_skipped(engine):
    _Engine.framing = "continue"
    assert _chats(engine, 2) == [0, 1]
    assert len(set(_Engine.peers)) == 1


def test_an_answer_cut_short_is_unavailable_and_not_sent_again(engine):
    with EngineClient(engine, generate_timeout_s=5) as client:
        client.completion({"model": "m", "max_tokens": 1})
        _Engine.framing = "cut"  # on the kept-alive connection, after part of the answer came
        with pytest.raises(EngineUnavailable, match="completions: MalformedResponse"):
            client.completion({"model": "m", "max_tokens": 2})
    assert [body["max_tokens"] for body in _Engine.served] == [1, 2]


def test_every_call_bears_the_engines_key_and_a_refused_key_is_an_engine_down(engine):
    _Engine.required_key = "the-engines-key"
    with EngineClient(engine, api_key="the-engines-key") as client:
        assert client.health()
        assert "num_requests_running" in client.metrics_text()
        assert client.completion({"model": "m", "max_tokens": 1})["usage"]["completion_tokens"]
    assert _Engine.keys == ["Bearer the-engines-key"] * 3
    # An engine started under another SECRET_KEY: no request can run there, and it is not the
    # tenant's request that it refused (a 4xx would be passed on to the client as its error).
    with (
        EngineClient(engine, api_key="another-key") as client,
        pytest.raises(EngineUnavailable, match="refused the platform's key"),
    ):
        client.completion({"model": "m", "max_tokens": 1})


def test_the_dispatchers_client_bears_the_key_on_whole_answers_and_streams(engine):
    _Engine.required_key = "k1"

    async def main(key: str) -> tuple[dict | None, list[bytes], Exception | None]:
        client = AsyncEngineClient(engine, connect_timeout_s=2, generate_timeout_s=10, api_key=key)
        try:
            answer = await client.generate("/v1/completions", {"model": "m", "max_tokens": 5})
            chunks = [c async for c in client.stream("/v1/completions", {"stream": True})]
            return answer, chunks, None
        except EngineUnavailable as exc:
            return None, [], exc
        finally:
            await client.close()

    answer, chunks, error = asyncio.run(main("k1"))
    assert error is None
    assert answer is not None
    assert answer["usage"]["completion_tokens"] == 2
    assert len(chunks) == 2
    assert _Engine.keys == ["Bearer k1", "Bearer k1"]
    *_, refused = asyncio.run(main("k2"))
    assert "refused the platform's key" in str(refused)


def test_an_engine_that_is_gone_is_unavailable():
    with (
        EngineClient("http://127.0.0.1:9", timeout_s=2) as client,
        pytest.raises(EngineUnavailable),
    ):
        client.completion({"model": "m"})


def _streamed(base_url: str, body: dict[str, object]) -> tuple[list[dict], Exception | None]:
    """The chunks the dispatcher's client reads from a stream, and the error it ended with."""

    async def main() -> tuple[list[dict], Exception | None]:
        client = AsyncEngineClient(base_url, connect_timeout_s=2, generate_timeout_s=10)
        received: list[dict] = []
        try:
            async for data in client.stream("/v1/chat/completions", body):
                received.append(json.loads(data))
        except EngineUnavailable as exc:
            return received, exc
        finally:
            await client.close()
        return received, None

    return asyncio.run(main())


def test_a_whole_stream_yields_its_chunks_and_a_cut_one_raises_after_them(engine):
    whole, error = _streamed(engine, {"model": "m", "max_tokens": 5, "stream": True})
    assert error is None
    _Engine.cut_stream = True
    received, error = _streamed(engine, {"model": "m", "max_tokens": 5, "stream": True})
    assert error is not None
    assert "without [DONE]" in str(error)
    assert [c["choices"][0]["delta"]["content"] for c in whole] == ["Hel", "lo"]
    assert received == whole


def test_the_dispatchers_client_posts_whole_answers_and_passes_refusals_on(engine):
    async def main() -> tuple[dict, EngineRequestError]:
        client = AsyncEngineClient(engine, connect_timeout_s=2, generate_timeout_s=10)
        try:
            answer = await client.generate("/v1/completions", {"model": "m", "max_tokens": 5})
            with pytest.raises(EngineRequestError) as refused:
                await client.generate("/v1/completions", {"model": "m", "max_tokens": -1})
            return answer, refused.value
        finally:
            await client.close()

    answer, refused = asyncio.run(main())
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}
    assert refused.status_code == 400
    assert "max_tokens must be at least 1" in refused.body


def _picked_stream(queue: FairQueue) -> Job:
    queue.set_tenant_policy("acme", TenantPolicy(1, 8 * UNIT))
    queue.set_engine_policy(EnginePolicy("e1", "m", 8 * UNIT, 2))
    payload = {
        "stream": True, "endpoint": "chat", "tenant_id": 1,
        "body": {"model": "m", "messages": []},
    }  # fmt: skip
    queue.enqueue(
        tenant="acme", pool="m", request_class="standard", prompt_tokens=4, max_tokens=8,
        kv_bytes=UNIT, payload=json.dumps(payload),
    )  # fmt: skip
    job = queue.pick("m")
    assert job is not None
    return job


def _events(queue: FairQueue, job: Job) -> list[str]:
    return [
        json.loads(e)["event"]
        for e in queue.redis.lrange(queue.keys.events(job.pool, job.job_id), 0, -1)
    ]


def _run(queue: FairQueue, job: Job, base_url: str) -> RunResult:
    async def main() -> RunResult:
        client = AsyncEngineClient(base_url, connect_timeout_s=2, generate_timeout_s=10)
        aio = AsyncFairQueue(queue, AsyncRedis(settings.REDIS_URL, max_connections=4,
                                               read_timeout_s=5))  # fmt: skip
        relay = Relay(aio)
        try:
            result = await run_job(aio, Run(job), client, relay)
            await relay.flush(job)
            return result
        finally:
            await client.close()
            aio.redis.close()

    return asyncio.run(main())


@pytest.mark.parametrize("finish", [True, False])
def test_a_stream_without_a_finish_reason_is_an_engine_failure_not_an_answer(
    engine, redis_db, finish
):
    _Engine.ends_with_a_reason = finish
    queue = fair_queue()
    job = _picked_stream(queue)
    result = _run(queue, job, engine)
    if finish:  # the answer: its `done` event is told with the release (the caller's step)
        assert result.outcome == "success"
        assert result.done_event == {"event": "done", "usage": ANY, "attempt": job.attempt}
        assert _events(queue, job) == ["chunk", "chunk"]
    else:  # run again (on this or another engine of the pool), the waiter told so
        assert result.outcome == "requeued"
        assert result.done_event is None
        assert _events(queue, job) == ["chunk", "chunk", "requeued"]
        again = queue.get_job(job.pool, job.job_id)
        assert again is not None
        assert again.state == "queued"

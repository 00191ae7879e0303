"""One request, one trace: the web's admission, its wait in the fair queue, the worker's run
and dispatch, the engine call (with its first token) and the answer's end, in that order,
in one trace, the context carried across Redis in the job's payload and to the engine in
`traceparent`. The web (config.asgi's whole application), the worker's dispatcher (its own
thread and loop), Redis and the database are the real ones, in this process, so the SDK's
in-memory exporter sees every span; the engine is an OpenAI-shaped stand-in over HTTP that
keeps the headers it was sent. A batch line is traced from its enqueue to its engine call."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scheduler import worker_tasks
from scheduler.models import Engine
from scheduler.pools.policies import sync_engine
from tests.scheduler.online.test_admission import MODEL, key_to_a_ready_engine
from tracing import setup, spans
from workers.dispatch import Dispatcher

pytestmark = pytest.mark.django_db(transaction=True)  # the web's threads see the rows

EXPORTER = InMemorySpanExporter()
WEB_SPANS = ("gpushare.admit", "gpushare.queue.wait", "gpushare.answer")
WORKER_SPANS = ("gpushare.run", "gpushare.dispatch")


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into the in-memory exporter, for the test (off again after it)."""
    if setup.provider() is None:
        setup.install(TracerProvider(), EXPORTER)
    else:
        spans.use(setup.provider().get_tracer(setup.TRACER_NAME))  # type: ignore[union-attr]
    EXPORTER.clear()
    yield EXPORTER
    spans.use(None)


class _Engine(BaseHTTPRequestHandler):
    """An engine's chat endpoint: a whole answer, or a stream of two chunks and usage."""

    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Engine.seen.append({k.lower(): v for k, v in self.headers.items()})
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if not body.get("stream"):
            answer = {
                "id": "x", "object": "chat.completion", "model": MODEL, "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "hi there"}}],
            }  # fmt: skip
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks: list[dict[str, Any]] = [
            {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage},
        ]
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps({"id": "x", **chunk}).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine_server() -> Iterator[ThreadingHTTPServer]:
    _Engine.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def platform(redis_db, tmp_path, engine_server, monkeypatch) -> Iterator[str]:
    """A key to a ready engine (the stand-in), and a worker's dispatcher that the web's
    summons reach in this process; yields the key's header."""
    bearer = key_to_a_ready_engine(tmp_path)
    engine = Engine.objects.get(name="e1")
    engine.host, engine.port = "127.0.0.1", engine_server.server_address[1]
    engine.save()
    sync_engine(engine)
    dispatcher = Dispatcher()
    monkeypatch.setattr(worker_tasks, "dispatch", dispatcher.ensure)
    yield bearer
    dispatcher.stop(drain_s=1)


def chat(bearer: str, *, stream: bool) -> httpx.Response:
    from config.asgi import application

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": stream}  # fmt: skip

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await c.post(
                "/v1/chat/completions", json=body, headers={"Authorization": bearer}, timeout=30
            )

    return asyncio.run(send())


def finished(exporter: InMemorySpanExporter, names: tuple[str, ...]) -> list[ReadableSpan]:
    """The spans once every name in `names` has ended (the worker ends its run's span just
    after the web has its answer)."""
    for _ in range(500):
        got = list(exporter.get_finished_spans())
        if set(names) <= {span.name for span in got}:
            return got
        threading.Event().wait(0.02)
    return list(exporter.get_finished_spans())


def by_name(found: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in found:
        named.setdefault(span.name, []).append(span)
    return named


def the(named: dict[str, list[ReadableSpan]], name: str) -> ReadableSpan:
    assert len(named.get(name, [])) == 1, (name, sorted(named))
    return named[name][0]


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


def start(span: ReadableSpan) -> int:
    assert span.start_time is not None
    return span.start_time


def end(span: ReadableSpan) -> int:
    assert span.end_time is not None
    return span.end_time


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "granted-stream"])
def test_a_request_is_one_trace_in_order_through_the_queue(traced, platform, stream, settings):
    settings.GPUSHARE_WEB_STREAMS_FROM_ENGINE = True  # a stream is the web's to make
    answer = chat(platform, stream=stream)
    assert answer.status_code == 200, answer.text
    request_id = answer.headers["x-request-id"]

    found = finished(traced, (*WEB_SPANS, *WORKER_SPANS, "gpushare.engine"))
    named = by_name(found)
    server = next(s for s in found if s.name.startswith("POST /v1/chat/completions"))
    admit, wait, answer_span = (the(named, n) for n in WEB_SPANS)
    run, dispatch, engine = (the(named, n) for n in (*WORKER_SPANS, "gpushare.engine"))

    # One trace: every span of the request is in the server span's.
    trace_id = server.context.trace_id
    ours = [s for s in found if s.context.trace_id == trace_id]
    assert {s.name for s in ours} >= {*WEB_SPANS, *WORKER_SPANS, "gpushare.engine"}
    assert all(s.context.trace_id == trace_id for s in (admit, wait, run, dispatch, engine))

    # Parents: the queue's wait is the worker run's parent (its context crossed Redis).
    assert parent_of(admit) == parent_of(wait) == server.context.span_id
    assert parent_of(run) == wait.context.span_id
    assert parent_of(dispatch) == run.context.span_id
    engine_parent = answer_span if stream else run  # a granted stream's call is the web's
    assert parent_of(engine) == engine_parent.context.span_id

    # In order: admitted, waited, picked, dispatched, the engine's first token, answered.
    assert start(wait) <= end(admit) <= end(wait)
    assert start(wait) <= start(run) <= end(wait)
    assert start(run) <= start(dispatch) <= end(dispatch) <= start(engine) + 1_000_000
    first_token = [e for e in engine.events if e.name == "first_token"]
    assert len(first_token) == 1
    assert start(engine) <= first_token[0].timestamp <= end(engine)
    assert end(wait) <= start(answer_span)
    if stream:  # the grant is the run's first word: the web calls the engine in its answer
        assert start(answer_span) <= start(engine) <= end(engine) <= end(answer_span)
    else:  # the whole answer is the run's first word, given once the call ended
        assert end(engine) <= start(answer_span) <= end(answer_span)
    assert end(answer_span) <= end(server)

    # What an operator looks a request up by.
    assert admit.attributes is not None
    assert run.attributes is not None
    assert admit.attributes["gpushare.request_id"] == request_id
    assert admit.attributes["gpushare.tenant"] == "acme"
    assert run.attributes["gpushare.request_id"] == request_id
    assert run.attributes["gpushare.engine"] == "e1"
    assert run.attributes["gpushare.outcome"] == "success"
    assert engine.attributes is not None
    assert engine.attributes["gen_ai.usage.output_tokens"] == 2

    # The engine was called inside the trace: its traceparent names the engine call's span.
    traceparent = _Engine.seen[-1]["traceparent"]
    assert traceparent.split("-")[1] == f"{trace_id:032x}"
    assert traceparent.split("-")[2] == f"{engine.context.span_id:016x}"


def test_nothing_is_dropped_at_the_queue_under_concurrent_requests(traced, platform, settings):
    """Eight requests at once: eight traces, each with its own wait, run and engine call."""
    settings.GPUSHARE_WEB_STREAMS_FROM_ENGINE = False  # the worker relays every stream

    async def many() -> list[httpx.Response]:
        from config.asgi import application

        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8, "stream": True}  # fmt: skip
            headers = {"Authorization": platform}
            posts = [
                c.post("/v1/chat/completions", json=body, headers=headers, timeout=30)
                for _ in range(8)
            ]
            return list(await asyncio.gather(*posts))

    answers = asyncio.run(many())
    assert [a.status_code for a in answers] == [200] * 8
    request_ids = {a.headers["x-request-id"] for a in answers}
    for _ in range(500):
        runs = [s for s in traced.get_finished_spans() if s.name == "gpushare.run"]
        if len(runs) == 8:
            break
        threading.Event().wait(0.02)
    found = list(traced.get_finished_spans())
    traces: dict[int, set[str]] = {}
    for span in found:
        traces.setdefault(span.context.trace_id, set()).add(span.name)
    complete = [t for t in traces.values() if {*WEB_SPANS, *WORKER_SPANS, "gpushare.engine"} <= t]
    assert len(complete) == 8
    ran = {s.attributes["gpushare.request_id"] for s in found if s.name == "gpushare.run"}
    assert ran == request_ids


def test_with_tracing_off_no_span_is_made_and_the_payload_carries_nothing(platform, redis_db):
    spans.use(None)
    EXPORTER.clear()
    answer = chat(platform, stream=False)
    assert answer.status_code == 200
    assert not EXPORTER.get_finished_spans()
    assert "traceparent" not in _Engine.seen[-1]


def test_a_batch_line_is_one_trace_from_its_enqueue_to_its_engine_call(
    traced, platform, settings, tmp_path
):
    from rest_framework.test import APIClient

    from scheduler.batches.feeder import batch_process
    from scheduler.models import Batch
    from tests.scheduler.batches.test_service import chat_jsonl, start_batch

    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=platform)
    batch_id = start_batch(client, chat_jsonl(2))["id"]
    batch_process(batch_pk=Batch.objects.get(public_id=batch_id).pk)

    for _ in range(500):  # both lines' runs, which end once released (after their calls)
        if len([s for s in traced.get_finished_spans() if s.name == "gpushare.run"]) == 2:
            break
        threading.Event().wait(0.02)
    found = list(traced.get_finished_spans())
    lines = [s for s in found if s.name == "gpushare.batch.line"]
    assert len(lines) == 2
    for line in lines:
        assert line.parent is None  # each line's trace is its own
        assert line.attributes is not None
        assert line.attributes["gpushare.batch_id"] == batch_id
        in_trace = by_name([s for s in found if s.context.trace_id == line.context.trace_id])
        run, engine = the(in_trace, "gpushare.run"), the(in_trace, "gpushare.engine")
        assert parent_of(run) == line.context.span_id
        assert parent_of(engine) == run.context.span_id
        assert run.attributes is not None
        assert run.attributes["gpushare.class"] == "offline"
        assert run.attributes["gpushare.batch_id"] == batch_id
    custom_ids = {line.attributes["gpushare.custom_id"] for line in lines if line.attributes}
    assert custom_ids == {"req-0", "req-1"}

"""A Responses call as the engine gets it and as its answer comes back, whoever makes it: the
engine is told store=false and the bound as max_output_tokens; the stream's events go to the
client as the engine wrote them (`event:` lines and all, no [DONE]); its usage is read from
its `response.completed` event, whole or streamed, relayed or granted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api import inference as openai_api
from fairqueue.domain import Job
from plumbing import wire
from protocol.classes import engine_priority
from protocol.inference import parse_inference_request
from scheduler.engines.calls import ResponseEvents, engine_body, usage_counts
from scheduler.engines.client import EngineUnavailable
from scheduler.online import admission as online
from scheduler.online import granted
from workers import runner

USAGE = {"input_tokens": 9, "output_tokens": 4, "total_tokens": 13,
         "input_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def sse_event(kind: str, **fields: Any) -> tuple[bytes, bytes]:
    data = wire.dumps_bytes({"type": kind, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data, data


STREAM = [
    sse_event("response.created", response={"status": "in_progress", "usage": None}),
    sse_event("response.output_text.delta", delta=" hi"),
    sse_event("response.output_text.delta", delta=" there"),
    sse_event("response.completed", response={"status": "incomplete", "usage": USAGE}),
]


def call(stream: bool = True, **fields: Any) -> dict[str, Any]:
    body = {"model": "m", "input": "hi", "max_output_tokens": 50, "max_tokens": 8, **fields}
    return {"endpoint": "responses", "stream": stream, "include_usage": True, "tenant_id": 1,
            "body": body}  # fmt: skip


def test_the_engine_is_told_never_to_store_and_the_bound_as_max_output_tokens() -> None:
    body = engine_body(call(store=True, cache_salt="mine", priority=-5), "standard", 12.0)
    assert body["store"] is False
    assert body["max_output_tokens"] == 8  # the platform's bound, not the client's 50
    assert "max_tokens" not in body
    assert "stream_options" not in body  # not a Responses field: its stream has the usage
    assert body["cache_salt"] != "mine"
    assert body["priority"] == engine_priority("standard", 12.0)
    chat = {"endpoint": "chat", "stream": True, "tenant_id": 1,
            "body": {"model": "m", "messages": [], "max_tokens": 8}}  # fmt: skip
    assert engine_body(chat, "standard", 0.0)["stream_options"] == {"include_usage": True}


def test_usage_is_read_in_either_shape() -> None:
    assert usage_counts({"prompt_tokens": 3, "completion_tokens": 2}) == (3, 2)
    assert usage_counts(USAGE) == (9, 4)
    assert usage_counts(None) is None
    assert usage_counts({}) is None


def test_the_events_reading_finds_the_first_output_the_end_and_its_usage() -> None:
    reading = ResponseEvents()
    reading.read(STREAM[0][1])
    assert not reading.first_output
    reading.read(STREAM[1][1])
    assert reading.first_output
    assert not reading.ended
    reading.read(STREAM[3][1])
    assert reading.ended
    assert reading.counts == (9, 4)


class Engine:
    """A stand-in engine client whose Responses stream is `frames`."""

    base_url = "http://engine"

    def __init__(self, frames: list[tuple[bytes, bytes]]) -> None:
        self.frames = frames
        self.bodies: list[dict[str, Any]] = []

    async def events(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        assert path == "/v1/responses"
        self.bodies.append(body)
        for frame in self.frames:
            yield frame


class Relay:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def chunk(self, run: Any, data: bytes, chunk: dict[str, Any]) -> None:
        self.chunks.append(data)


def run_of(request: dict[str, Any]) -> runner.Run:
    job = Job("j1", "t", "p", "standard", 9, 8, 1, payload=wire.dumps(request), attempt=1)
    return runner.Run(job)


@pytest.mark.parametrize("cut", [False, True])
def test_a_relayed_stream_passes_each_event_on_and_charges_its_usage(cut: bool) -> None:
    frames = STREAM[:-1] if cut else STREAM
    engine, relay = Engine(frames), Relay()
    result = runner.RunResult(outcome="success")
    growth = runner.Growth(None, "p", "j1", 1, -1)  # type: ignore[arg-type]  # never grows
    calling = runner._call_engine(run_of(call()), engine, relay, result, growth)  # type: ignore[arg-type]
    if cut:
        with pytest.raises(EngineUnavailable, match="before its last event"):
            asyncio.run(calling)
        return
    asyncio.run(calling)
    assert relay.chunks == [frame for frame, _ in STREAM]  # unchanged, event lines and all
    assert (result.prompt_tokens, result.completion_tokens) == (9, 4)
    assert result.first_token_at is not None
    assert result.done_event is not None
    assert result.done_event["usage"]["prompt_tokens"] == 9
    assert engine.bodies[0]["store"] is False


GRANT = {"attempt": 1, "url": "http://engine", "reply": "inbox"}


async def granted_events(queue: Queue) -> list[dict[str, Any]]:
    words: asyncio.Queue[bytes] = asyncio.Queue()
    aq: Any = queue
    stream = granted.GrantedStream(aq, "p", "j1", "standard", call(), GRANT, words)
    return [event async for event in stream.events()]


class Queue:
    def __init__(self) -> None:
        self.answers: list[str] = []

    async def answer(self, pool: str, job_id: str, report: str, reply: str, *, keep: bool) -> None:
        self.answers.append(report)


def test_a_granted_stream_sends_the_events_on_and_reports_the_real_tokens(monkeypatch) -> None:
    engine, queue = Engine(STREAM), Queue()
    monkeypatch.setattr(granted, "engine_client", lambda url: engine)
    events = asyncio.run(granted_events(queue))
    assert [e["raw"] for e in events if e["event"] == "chunk"] == [f for f, _ in STREAM]
    assert events[-1]["event"] == "done"
    assert events[-1]["usage"]["completion_tokens"] == 4
    report = granted.Report.parse(queue.answers[-1])
    assert (report.outcome, report.prompt_tokens, report.completion_tokens) == ("success", 9, 4)
    assert report.first_token_at is not None


def test_a_granted_stream_cut_before_its_end_reports_the_engine_lost(monkeypatch) -> None:
    engine, queue = Engine(STREAM[:2]), Queue()
    monkeypatch.setattr(granted, "engine_client", lambda url: engine)
    events = asyncio.run(granted_events(queue))
    assert all(e["event"] == "chunk" for e in events)  # no `done`: the worker's word follows
    assert granted.Report.parse(queue.answers[-1]).outcome == "engine_lost"


def admitted(endpoint: str, body: dict[str, Any]) -> online.Admitted:
    job = Job("j1", "t", "p", "standard", 9, 8, 1)
    request = parse_inference_request(endpoint, body)  # type: ignore[arg-type]
    return online.Admitted(job, request, 1, 1, 0.0)


def sse_of(monkeypatch, endpoint: str, body: dict[str, Any], events: list[dict]) -> bytes:
    async def follow(admitted: Any, client_gone: Any) -> AsyncIterator[dict[str, Any]]:
        for event in events:
            yield event

    monkeypatch.setattr(online, "follow", follow)

    async def collect() -> bytes:
        gone: Any = None
        return b"".join([c async for c in openai_api._sse(admitted(endpoint, body), gone)])

    return asyncio.run(collect())


def test_the_web_writes_a_responses_stream_as_its_events_without_done(monkeypatch) -> None:
    chunks = [{"event": "chunk", "attempt": 1, "raw": frame} for frame, _ in STREAM]
    body = {"model": "m", "input": "hi", "stream": True}
    written = sse_of(monkeypatch, "responses", body, [*chunks, {"event": "done"}])
    assert written == b"".join(frame + b"\n\n" for frame, _ in STREAM)

    error = {"event": "error", "status": 400,
             "body": {"error": {"message": "no", "type": "invalid_request_error",
                                "code": "bad", "param": "input"}}}  # fmt: skip
    failed = sse_of(monkeypatch, "responses", body, [chunks[0], error])
    assert failed.startswith(STREAM[0][0] + b"\n\n")
    name, data = failed.split(b"\n\n")[1].split(b"\n")
    assert name == b"event: error"
    event = json.loads(data.removeprefix(b"data: "))
    assert (event["type"], event["code"], event["param"]) == ("error", "bad", "input")
    assert event["error"]["message"] == "no"  # the `openai` client raises it as an APIError
    assert b"[DONE]" not in failed


def test_a_chat_stream_is_still_data_lines_ending_with_done(monkeypatch) -> None:
    chunk = {"event": "chunk", "attempt": 1, "raw": b'{"choices":[]}'}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    written = sse_of(monkeypatch, "chat", body, [chunk, {"event": "done"}])
    assert written == b'data: {"choices":[]}\n\ndata: [DONE]\n\n'

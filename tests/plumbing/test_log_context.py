"""Where a request's tenant and engine become known, its log lines name them: the web binds
the tenant once it admitted the request and the engine when a worker grants it the call
(the grant names it); a worker binds the job's id, tenant and engine for each job it runs,
each job on its own task, however many run at once."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from fairqueue import FairQueue, Job
from plumbing import request_ids
from plumbing.json_logs import JsonFormatter
from plumbing.request_ids import RequestIdFilter, request_id_scope
from protocol.inference import parse_inference_request
from scheduler.online import admission as online
from scheduler.online.granted import Report
from tests.scheduler.online.test_admission import MODEL, key_to_a_ready_engine
from tests.workers.test_dispatch import POOL, dispatcher, enqueue, queue, summons, wait_until
from tests.workers.test_granted import picked, reporting, run_granted
from workers import dispatch as dispatch_module
from workers.dispatch import Dispatcher
from workers.runner import Run, RunResult

__all__ = ["dispatcher", "queue", "summons"]  # the fixtures, as test_dispatch makes them

log = logging.getLogger("api")


@pytest.fixture
def web_log() -> Iterator[io.StringIO]:
    """The lines of the `api` logger, as the console handler writes them in JSON."""
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield lines
    log.removeHandler(handler)
    log.setLevel(logging.NOTSET)


def lines_of(web_log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in web_log.getvalue().splitlines()]


def chat() -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    return parse_inference_request("chat", body)


@pytest.mark.django_db(transaction=True)  # admission reads the key in a thread
def test_a_line_the_web_logs_once_it_admitted_a_request_names_its_tenant(
    redis_db, tmp_path, web_log
):
    bearer = key_to_a_ready_engine(tmp_path)

    async def served() -> str:
        with request_id_scope() as request_id:
            log.info("arrived")
            await online.admit(authorization=bearer, request=chat(), class_header="")
            log.info("queued")
        return request_id

    request_id = asyncio.run(served())

    arrived, queued = lines_of(web_log)
    assert (arrived["request_id"], arrived.get("tenant")) == (request_id, None)
    assert (queued["request_id"], queued["tenant"]) == (request_id, "acme")


def test_a_line_the_web_logs_once_its_request_was_granted_names_the_engine(
    redis_db, monkeypatch, web_log
):
    class Stream:
        """The granted call, as far as the log goes: a line while it streams."""

        def __init__(self, *args: Any) -> None:
            pass

        async def events(self) -> AsyncIterator[dict[str, Any]]:
            log.info("streaming")
            yield {"event": "done", "attempt": 1}

    monkeypatch.setattr(online, "GrantedStream", Stream)

    async def served() -> None:
        events: asyncio.Queue[bytes] = asyncio.Queue()
        grant = {"event": "grant", "attempt": 1, "url": "http://e", "reply": "r", "engine": "e7"}
        events.put_nowait(json.dumps(grant).encode())
        job = Job("j1", "acme", "p", "standard", 1, 1, 1)
        admitted = online.Admitted(job, chat(), 1, 1, time.time(), events)
        with request_id_scope():
            request_ids.bind(tenant="acme")
            log.info("waiting")
            assert [e["event"] async for e in online.follow(admitted)] == ["done"]
            log.info("answered")

    asyncio.run(served())

    waiting, streaming, answered = lines_of(web_log)
    assert "engine" not in waiting
    assert streaming["engine"] == answered["engine"] == "e7"
    assert answered["tenant"] == "acme"


def test_a_grant_names_the_engine_of_the_run(queue: FairQueue) -> None:
    job = picked(queue)
    _, events = run_granted(queue, job, reporting(Report(prompt_tokens=1, completion_tokens=1)))

    assert events[0]["event"] == "grant"
    assert events[0]["engine"] == job.engine_id == "e1"


def test_a_worker_s_lines_about_a_job_name_it_its_tenant_and_engine(
    queue, dispatcher: Dispatcher, summons, monkeypatch
):
    seen: dict[str, dict[str, str]] = {}

    async def run_picked(dispatcher: Dispatcher, run: Run) -> RunResult:
        await asyncio.sleep(0.05)  # the jobs run at once, on one loop
        seen[run.job.job_id] = request_ids.context()
        return RunResult(outcome="success", prompt_tokens=1, completion_tokens=1)

    monkeypatch.setattr(dispatch_module, "run_picked", run_picked)
    ids = enqueue(queue, 3)
    dispatcher.ensure(POOL)

    assert wait_until(lambda: len(seen) == 3)
    assert seen == {
        job_id: {"request_id": job_id, "tenant": "acme", "engine": "e1"} for job_id in ids
    }

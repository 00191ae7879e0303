"""A request's id, from the web to the logs: every /v1/ answer's `X-Request-Id` is the id the
web's log lines about the request end with, a queued request's job id is the same id, and
the workers' lines about a job name it."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from fairqueue import Job
from plumbing import request_ids
from plumbing.request_ids import RequestIdFilter, request_id_scope
from scheduler.online import admission as online
from tests.asgi import asgi_request
from tests.scheduler.online.test_admission import admit, key_to_a_ready_engine, queued_ids
from workers import tasks
from workers.runner import Relay, Run

CHAT = "/v1/chat/completions"
LOGGING: dict[str, Any] = settings.LOGGING


def web_handler(lines: io.StringIO) -> logging.Handler:
    """A handler that writes to `lines` as the web's console handler writes its lines."""
    handler = logging.StreamHandler(lines)
    handler.setFormatter(logging.Formatter(LOGGING["formatters"]["plain"]["format"]))
    handler.addFilter(RequestIdFilter())
    return handler


def test_a_request_id_is_current_only_inside_its_scope():
    assert request_ids.current() is None
    with request_id_scope() as outer:
        assert request_ids.current() == outer
        with request_id_scope() as inner:
            assert request_ids.current() == inner != outer
        assert request_ids.current() == outer
    assert request_ids.current() is None


def test_the_log_format_ends_a_line_with_the_request_id_only_inside_a_request():
    lines = io.StringIO()
    handler = web_handler(lines)
    record = logging.LogRecord(
        "scheduler.online.admission", logging.WARNING, "", 0, "it broke", (), None
    )

    handler.handle(record)
    with request_id_scope() as request_id:
        handler.handle(record)

    outside, inside = lines.getvalue().splitlines()
    assert outside.endswith("scheduler.online.admission: it broke")
    assert inside.endswith(f"scheduler.online.admission: it broke request_id={request_id}")


def test_the_web_s_log_handler_carries_the_filter():
    filters = LOGGING["handlers"]["console"]["filters"]
    assert [LOGGING["filters"][name]["()"] for name in filters] == [
        "plumbing.request_ids.RequestIdFilter"
    ]


@pytest.fixture
def web_log() -> Iterator[io.StringIO]:
    """The web's log lines, formatted as the console handler writes them."""
    lines = io.StringIO()
    handler = web_handler(lines)
    logger = logging.getLogger("api")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def test_a_line_the_web_logs_about_a_request_carries_the_id_of_its_answer(monkeypatch, web_log, db):
    async def down(authorization: str) -> None:
        raise redis.ConnectionError("Redis is away")

    monkeypatch.setattr(online, "authenticate", down)

    answer = asgi_request("POST", CHAT, json={}, headers={"Authorization": "Bearer gs-x"})

    assert answer.status_code == 503
    request_id = answer.headers["x-request-id"]
    (line,) = [line for line in web_log.getvalue().splitlines() if "dependency is down" in line]
    assert line.endswith(f" request_id={request_id}")


@pytest.mark.django_db(transaction=True)  # admission reads the key in a thread
def test_a_request_admitted_while_the_web_serves_it_is_queued_under_its_id(redis_db, tmp_path):
    bearer = key_to_a_ready_engine(tmp_path)

    with request_id_scope() as request_id:
        served = admit(bearer)
    alone = admit(bearer)  # outside a request: an id of its own

    assert served.job.job_id == request_id
    assert alone.job.job_id not in ("", request_id)
    assert queued_ids() == [request_id, alone.job.job_id]


def test_housekeeping_names_the_jobs_it_reaped_and_expired(monkeypatch, caplog):
    class Queue:
        def pools(self) -> list[str]:
            return ["p"]

        def reap_expired_leases(self, *, pool: str) -> list[str]:
            return ["reaped0a"]

        def expire_waiting(self, *, pool: str) -> list[str]:
            return ["expired1b", "expired2c"]

        def pools_with_waiting_work(self) -> list[str]:
            return []

        def rebalance_leases(self) -> list[str]:
            return []

    monkeypatch.setattr(tasks, "fair_queue", Queue)
    monkeypatch.setattr(tasks, "sync_engines_if_changed", lambda queue: None)
    monkeypatch.setattr(tasks, "timeouts_record", lambda queue, pool, expired: None)

    with caplog.at_level(logging.INFO, logger="workers.tasks"):
        tasks.housekeeping()

    assert "1 leases reaped [reaped0a]" in caplog.text
    assert "2 waiting jobs expired [expired1b expired2c]" in caplog.text


def test_events_a_worker_could_not_relay_are_logged_with_their_jobs(caplog):
    class Down:
        async def publish_many(self, batch: list[tuple[str, str]]) -> None:
            raise redis.ConnectionError("Redis is away")

    def run(job_id: str) -> Run:
        job = Job(job_id, "acme", "p", "standard", 1, 1, 1, payload='{"inbox": "in"}')
        return Run(job)

    async def relay() -> None:
        relaying = Relay(Down())  # type: ignore[arg-type]
        first, second = run("job0a"), run("job1b")
        for r in (first, second, first):
            relaying.publish(r, {"event": "done"})
        with pytest.raises(redis.ConnectionError):
            await relaying.flush(first.job)

    with caplog.at_level(logging.WARNING, logger="workers.runner"):
        asyncio.run(relay())

    assert "could not relay 3 events of jobs job0a job1b: Redis is away" in caplog.text

"""A granted stream, worker side, against the real Redis: the run tells the waiter to stream
from the engine itself and ends as the waiter's report says (the tokens; the engine's
refusal, answered to the waiter; the engine lost, the job given back); a job whose answer a
web already gave is only released; a run whose web went silent gives up, unless the web's
report is in the job. The web here is the test, answering through the queue's own script
(`AsyncFairQueue.answer`), as scheduler/online/granted.py does; tests/e2e drive the real web and
engine."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from django.conf import settings as django_settings

from fairqueue import EnginePolicy, FairQueue, TenantPolicy
from fairqueue.aio import AsyncFairQueue
from fairqueue.inbox import Inboxes, parse_event
from plumbing.aio_redis import AsyncRedis
from scheduler.engines.aio_client import AsyncEngineClient
from scheduler.online.granted import Report
from scheduler.pools.policies import fair_queue
from workers import runner
from workers.runner import Relay, Run, RunResult, run_job

UNIT = 256 * 1024 * 1024
ENGINE_URL = "http://127.0.0.1:9"  # never called: the waiter makes the call


@pytest.fixture
def queue(redis_db) -> FairQueue:
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(1, 100 * UNIT))
    queue.set_engine_policy(EnginePolicy("e1", "m", 100 * UNIT, 4))
    return queue


def picked(queue: FairQueue, *, stream: bool = True) -> Any:
    inbox = queue.keys.inbox("m", "test-waiter")
    payload = {
        "inbox": inbox, "endpoint": "chat", "stream": stream, "tenant_id": 1, "model": "m",
        "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
    }  # fmt: skip
    queue.enqueue_summoning(
        tenant="acme", pool="m", request_class="interactive", prompt_tokens=5, max_tokens=8,
        kv_bytes=UNIT, payload=json.dumps(payload), inbox=inbox,
    )  # fmt: skip
    job = queue.pick("m", "e1")
    assert job is not None
    return job


# The test's web: given the queue, the job's id and its grant.
Web = Callable[[AsyncFairQueue, str, dict[str, Any]], Awaitable[None]]


def run_granted(
    queue: FairQueue, job: Any, web: Web | None, run: Run | None = None
) -> tuple[RunResult, list[dict]]:
    """Runs the job (as `run`, where given) on the worker side while `web` answers its
    grant; returns the result and the events the waiter's inbox got."""

    async def main() -> tuple[RunResult, list[dict]]:
        client = AsyncRedis(django_settings.REDIS_URL, max_connections=8, read_timeout_s=30)
        aq = AsyncFairQueue(queue, client)
        reports = Inboxes(client, queue.keys, "test-worker")
        engine = AsyncEngineClient(ENGINE_URL, connect_timeout_s=1, generate_timeout_s=5)
        relay = Relay(aq)
        waiter = asyncio.ensure_future(_act_as_web(aq, job.job_id, web))
        try:
            result = await run_job(aq, run or Run(job), engine, relay, reports=reports)
            await relay.flush(job)
            await asyncio.sleep(0.05)
        finally:
            waiter.cancel()
            await reports.close()
            await engine.close()
        entries = await client.call("LRANGE", queue.keys.inbox("m", "test-waiter"), 0, -1)
        client.close()
        events = [parse_event(entry.partition(b" ")[2]) for entry in entries]
        return result, events

    return asyncio.run(main())


async def _act_as_web(aq: AsyncFairQueue, job_id: str, web: Web | None) -> None:
    if web is None:
        return
    inbox = aq.keys.inbox("m", "test-waiter")
    while True:
        entries = await aq.redis.call("LRANGE", inbox, 0, -1)
        grants = [parse_event(e.partition(b" ")[2]) for e in entries]
        grant = next((g for g in grants if g.get("event") == "grant"), None)
        if grant is not None:
            await web(aq, job_id, grant)
            return
        await asyncio.sleep(0.01)


def reporting(report: Report, *, before: Report | None = None) -> Web:
    async def web(aq: AsyncFairQueue, job_id: str, grant: dict[str, Any]) -> None:
        assert grant["url"] == ENGINE_URL
        if before is not None:
            await aq.answer("m", job_id, before.dumps(), grant["reply"], keep=False)
        await aq.answer(
            "m", job_id, report.dumps(), grant["reply"], keep=report.outcome == "success"
        )

    return web


def test_a_granted_stream_ends_with_the_tokens_its_web_reports(queue: FairQueue) -> None:
    job = picked(queue)
    first = time.time()
    report = Report(prompt_tokens=7, completion_tokens=11, first_token_at=first)
    result, events = run_granted(queue, job, reporting(report, before=Report(final=False)))

    assert [e["event"] for e in events] == ["grant"]  # no chunk, no done: the web told them
    assert events[0]["attempt"] == job.attempt
    assert (result.outcome, result.prompt_tokens, result.completion_tokens) == ("success", 7, 11)
    assert result.first_token_at == first
    assert result.done_event is None
    kept = queue.get_job(job.pool, job.job_id)
    assert kept is not None
    assert kept.answered  # for a run that picks it after a dead worker


def test_the_engines_refusal_is_answered_to_the_waiter(queue: FairQueue) -> None:
    job = picked(queue)
    refusal = json.dumps({"message": "max_tokens is too large"})
    report = Report(outcome="refused", status_code=400, detail=refusal)
    result, events = run_granted(queue, job, reporting(report))

    assert (result.outcome, result.status_code) == ("error", 400)
    assert [e["event"] for e in events] == ["grant", "error"]
    assert events[1]["body"]["error"]["message"] == "max_tokens is too large"


def test_an_engine_lost_under_the_web_gives_the_job_back(queue: FairQueue) -> None:
    job = picked(queue)
    report = Report(outcome="engine_lost", detail="connection reset")
    result, events = run_granted(queue, job, reporting(report))

    assert result.outcome == "requeued"
    assert [e["event"] for e in events] == ["grant", "requeued"]
    requeued = queue.get_job(job.pool, job.job_id)
    assert requeued is not None
    assert requeued.state == "queued"
    assert requeued.answered == ""  # its next run calls the engine again


def test_a_stream_its_client_left_is_released_with_what_its_web_streamed(
    queue: FairQueue,
) -> None:
    """The web's report of a cut stream comes before its cancel: the run ends cancelled, to
    be released with the pieces streamed and, the engine having given no count, the prompt's
    reservation."""
    job = picked(queue)
    cut = Report(outcome="cancelled", completion_tokens=3, cut_short=True)
    result, events = run_granted(queue, job, reporting(cut))

    assert (result.outcome, result.prompt_tokens, result.completion_tokens) == ("cancelled", 5, 3)
    assert [e["event"] for e in events] == ["grant"]


def test_a_run_its_web_cancelled_first_waits_for_the_web_s_report(queue: FairQueue) -> None:
    """The client left; the web's cancel reaches the queue first, and the dispatcher's watch
    stops the run as no longer its own: the web's report of what was used still comes."""
    job = picked(queue)
    run = Run(job)

    async def cancels_then_reports(aq: AsyncFairQueue, job_id: str, grant: dict[str, Any]) -> None:
        await aq.cancel("m", job_id, reason="client_gone")
        run.stop("lost")  # as the dispatcher's watch does
        await asyncio.sleep(0.3)
        cut = Report(outcome="cancelled", prompt_tokens=4, completion_tokens=6, cut_short=True)
        await aq.answer("m", job_id, cut.dumps(), grant["reply"], keep=False)

    result, _ = run_granted(queue, job, cancels_then_reports, run)
    assert (result.outcome, result.prompt_tokens, result.completion_tokens) == ("cancelled", 4, 6)


def test_a_cut_stream_too_large_is_answered_and_charged(queue: FairQueue) -> None:
    job = picked(queue)
    cut = Report(outcome="refused", status_code=400, completion_tokens=7, cut_short=True)
    result, events = run_granted(queue, job, reporting(cut))

    assert (result.outcome, result.error_code) == ("error", "answer_too_large")
    assert (result.prompt_tokens, result.completion_tokens) == (5, 7)
    assert events[-1]["body"]["error"]["code"] == "answer_too_large"


def test_a_job_its_web_already_answered_is_only_released(queue: FairQueue) -> None:
    job = picked(queue)
    answered = Report(prompt_tokens=3, completion_tokens=4).dumps()
    queue.redis.hset(queue.keys.job(job.pool, job.job_id), "answered", answered)
    job = queue.get_job(job.pool, job.job_id)
    result, events = run_granted(queue, job, None)

    assert events == []  # no grant: the answer was given
    assert (result.outcome, result.prompt_tokens, result.completion_tokens) == ("success", 3, 4)


def test_a_silent_web_is_given_up_unless_its_report_is_in_the_job(
    queue: FairQueue, monkeypatch
) -> None:
    monkeypatch.setattr(runner, "GRANT_SILENCE_S", 0.3)
    job = picked(queue)
    result, _ = run_granted(queue, job, None)
    assert result.outcome == "cancelled"

    other = picked(queue)

    async def reports_only_to_the_job(aq: AsyncFairQueue, job_id: str, _: dict[str, Any]) -> None:
        report = Report(prompt_tokens=2, completion_tokens=9).dumps()
        await aq.answer("m", job_id, report, "", keep=True)  # its worker's inbox lost

    result, _ = run_granted(queue, other, reports_only_to_the_job)
    assert (result.outcome, result.completion_tokens) == ("success", 9)


def test_a_stream_without_a_waiter_or_when_granting_is_off_is_relayed(
    queue: FairQueue, settings
) -> None:
    settings.GPUSHARE_WEB_STREAMS_FROM_ENGINE = False
    assert not runner.grants(Run(picked(queue)))
    settings.GPUSHARE_WEB_STREAMS_FROM_ENGINE = True
    assert runner.grants(Run(picked(queue)))
    assert not runner.grants(Run(picked(queue, stream=False)))


def test_a_predicted_grant_tells_its_web_what_the_reservation_covers(queue: FairQueue) -> None:
    queue.set_engine_policy(EnginePolicy("e1", "m", 100 * UNIT, 4, reservation="predict"))
    for _ in range(8):  # the tenant's answers: 3 tokens each
        job = picked(queue)
        assert queue.release(job.pool, job.job_id, 5, 3)
    inbox = queue.keys.inbox("m", "test-waiter")
    payload = {
        "inbox": inbox, "endpoint": "chat", "stream": True, "tenant_id": 1, "model": "m",
        "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
    }  # fmt: skip
    queue.redis.delete(inbox)
    queue.enqueue_summoning(
        tenant="acme", pool="m", request_class="interactive", prompt_tokens=5, max_tokens=100,
        kv_bytes=UNIT, kv_floor=UNIT // 2, kv_token=1000, observed=True,
        payload=json.dumps(payload), inbox=inbox,
    )  # fmt: skip
    job = queue.pick("m", "e1")
    assert job is not None
    assert job.reserved == UNIT // 2 + 3 * 1000
    report = Report(prompt_tokens=5, completion_tokens=3)
    _, events = run_granted(queue, job, reporting(report))
    assert events[0]["covered"] == 3

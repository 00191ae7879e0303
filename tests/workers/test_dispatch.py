"""The dispatch loop's bookkeeping on the real Redis fair queue: each job it runs is released
once with its real tokens (with the next pick in the same step), a turn that ends hands the
rest of the pool to a new message, and a failure after a job ran does not strand the job it
had already picked. The engine call is replaced by a recorded result: what runs on a real
engine is covered in tests/e2e and tests/reliability."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.conf import settings

from scheduler.fairqueue import EnginePolicy, FairQueue, Job, TenantPolicy
from scheduler.pools import fair_queue
from tenants.usage_buffer import PENDING_KEY as USAGE_PENDING_KEY
from workers import dispatch as dispatch_module
from workers import tasks
from workers.runner import RunResult

POOL = "m"
IDLE_S = 0.5  # how long a loop with nothing to run waits (a minute when deployed)
UNIT = 256 * 1024 * 1024


@pytest.fixture
def queue(redis_db) -> FairQueue:
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(1, 8 * UNIT))
    queue.set_engine_policy(EnginePolicy("e1", POOL, 8 * UNIT, 2))
    return queue


@pytest.fixture
def ran(monkeypatch) -> list[Job]:
    """Jobs 'run' in order; each used 10 prompt and 5 completion tokens."""
    seen: list[Job] = []

    def run_picked(queue: FairQueue, job: Job) -> RunResult:
        seen.append(job)
        return RunResult(outcome="success", prompt_tokens=10, completion_tokens=5)

    monkeypatch.setattr(dispatch_module, "run_picked", run_picked)
    monkeypatch.setattr(dispatch_module, "settle", lambda job, request, result: None)
    return seen


def enqueue(queue: FairQueue, count: int) -> list[str]:
    return [submit(queue).job_id for _ in range(count)]


def submit(queue: FairQueue) -> Job:
    return queue.enqueue(
        tenant="acme", pool=POOL, request_class="standard", prompt_tokens=10, max_tokens=20,
        kv_bytes=UNIT, payload=json.dumps(PAYLOAD),
    )  # fmt: skip


PAYLOAD = {"tenant_id": 7, "model": POOL, "endpoint": "chat", "stream": False}


def test_every_job_runs_once_and_is_released_with_its_tokens(queue, ran):
    ids = enqueue(queue, 5)
    assert dispatch_module.dispatch_pool(POOL, idle_s=IDLE_S) == 5
    assert [job.job_id for job in ran] == ids
    for job_id in ids:
        fields = queue.redis.hgetall(queue.keys.job(job_id))
        assert fields["state"] == "done"
        assert (fields["used_prompt_tokens"], fields["used_completion_tokens"]) == ("10", "5")
    snap = queue.snapshot()
    assert snap.engine_reserved_bytes["e1"] == 0
    assert snap.engine_inflight["e1"] == 0
    assert queue.check().ok


def test_each_run_tells_its_answer_and_its_ledger_row_with_its_release(queue, monkeypatch):
    """The waiter's `done` event and the ledger's row go in the release's own step."""
    answer = {"id": "cmpl-1", "choices": []}

    def run_picked(queue: FairQueue, job: Job) -> RunResult:
        done = {"event": "done", "body": answer, "attempt": job.attempt}
        return RunResult(outcome="success", prompt_tokens=10, completion_tokens=5,
                         finished_at=time.time(), done_event=done)  # fmt: skip

    monkeypatch.setattr(dispatch_module, "run_picked", run_picked)
    monkeypatch.setattr(dispatch_module, "settle", lambda job, request, result: None)
    queue.redis.delete(USAGE_PENDING_KEY)
    ids = enqueue(queue, 3)
    assert dispatch_module.dispatch_pool(POOL, idle_s=IDLE_S) == 3
    for job_id in ids:
        [event] = [json.loads(e) for e in queue.redis.lrange(queue.keys.events(job_id), 0, -1)
                   if json.loads(e)["event"] == "done"]  # fmt: skip
        assert event == {"event": "done", "body": answer, "attempt": 1}  # its first run
    rows = [json.loads(row) for row in queue.redis.lrange(USAGE_PENDING_KEY, 0, -1)]
    assert [(r["request_id"], r["tenant_id"], r["outcome"]) for r in rows] == [
        (job_id, 7, "success") for job_id in ids
    ]
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [(10, 5)] * 3


def test_a_turn_that_ends_releases_its_job_and_hands_the_rest_on(queue, ran, monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr(tasks.dispatch, "delay", sent.append)
    enqueue(queue, 3)
    assert dispatch_module.dispatch_pool(POOL, turn_s=0.0, idle_s=IDLE_S) == 1
    # One message from the loop's start (more work waited and no loop was idle: it fans
    # out), one from the end of its turn.
    assert sent == [POOL, POOL]
    assert queue.snapshot().engine_inflight["e1"] == 0
    assert [row.waiting for row in queue.snapshot().queues] == [2]


def test_a_failed_ledger_write_gives_back_the_job_picked_next(queue, ran, monkeypatch):
    def fail(job: Job, request: dict, result: RunResult) -> None:
        raise RuntimeError("the database is down")

    monkeypatch.setattr(dispatch_module, "settle", fail)
    first, second = enqueue(queue, 2)
    with pytest.raises(RuntimeError):
        dispatch_module.dispatch_pool(POOL, idle_s=IDLE_S)
    assert queue.get_job(first).state == "done"
    picked_again = queue.get_job(second)
    assert picked_again is not None
    assert picked_again.state == "queued"  # not left leased to a loop that stopped
    assert queue.snapshot().engine_inflight["e1"] == 0
    assert queue.check().ok


def test_a_loop_with_nothing_to_run_waits_and_new_work_reaches_it_without_a_message(
    queue, ran, monkeypatch
):
    sent: list[str] = []
    monkeypatch.setattr(tasks.dispatch, "delay", sent.append)
    done: list[int] = []
    loop = threading.Thread(
        target=lambda: done.append(dispatch_module.dispatch_pool(POOL, idle_s=IDLE_S))
    )
    loop.start()
    deadline = time.monotonic() + 5
    while not queue.redis.zcard(queue.keys.idle_loops(POOL)) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the loop has found nothing and waits

    job, summon = queue.enqueue_summoning(
        tenant="acme", pool=POOL, request_class="standard", prompt_tokens=10, max_tokens=20,
        kv_bytes=UNIT, payload=json.dumps(PAYLOAD),
    )  # fmt: skip

    assert summon is False
    loop.join(timeout=10)
    assert done == [1]  # it ran the job, then waited in vain and ended
    assert [j.job_id for j in ran] == [job.job_id]
    assert sent == []  # no Celery message on the way
    assert queue.redis.zcard(queue.keys.idle_loops(POOL)) == 0


def test_a_process_runs_no_more_loops_than_its_threads_less_the_free_ones(queue, ran, monkeypatch):
    """Loops wait for work instead of ending: the threads kept free run the other tasks."""
    seats = dispatch_module._LoopSeats()
    monkeypatch.setattr(dispatch_module, "loop_seats", seats)
    monkeypatch.setattr(settings, "GPUSHARE_WORKER_FREE_THREADS", 2)
    seats.size_for(3)  # one loop
    first = threading.Thread(target=lambda: dispatch_module.dispatch_pool(POOL, idle_s=5))
    first.start()
    deadline = time.monotonic() + 5
    while not queue.redis.zcard(queue.keys.idle_loops(POOL)) and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    assert dispatch_module.dispatch_pool(POOL, idle_s=5) == 0  # no seat: back at once
    assert time.monotonic() - started < 1
    seats.stopping.set()  # a warm shutdown: the waiting loop ends within a wait slice
    first.join(timeout=3)
    assert not first.is_alive()
    assert queue.redis.zcard(queue.keys.idle_loops(POOL)) == 0  # and is no longer idle


def test_a_loop_hands_its_database_connection_back_after_each_job(
    queue, ran, monkeypatch, transactional_db
):
    """Loops live for minutes; a connection held meanwhile would be missing from the pool.
    (Counted at `close`: an in-memory SQLite test database ignores it, PostgreSQL's pool
    takes the connection back.)"""
    from django.db import connection

    from tenants.models import Tenant

    events: list[str] = []
    real_close = connection.close

    def close() -> None:
        events.append("close")
        real_close()

    def settle(job: Job, request: dict, result: RunResult) -> None:
        Tenant.objects.count()  # as a batch line's write would
        events.append("query")

    monkeypatch.setattr(connection, "close", close)
    monkeypatch.setattr(dispatch_module, "settle", settle)
    enqueue(queue, 2)
    assert dispatch_module.dispatch_pool(POOL, idle_s=IDLE_S) == 2
    assert events == ["query", "close", "query", "close"]  # handed back after each job


def test_a_loop_woken_as_its_worker_stops_hands_the_work_to_a_new_loop(queue, ran, monkeypatch):
    seats = dispatch_module._LoopSeats()
    monkeypatch.setattr(dispatch_module, "loop_seats", seats)
    sent: list[str] = []
    monkeypatch.setattr(tasks.dispatch, "delay", sent.append)
    done: list[int] = []
    loop = threading.Thread(
        target=lambda: done.append(dispatch_module.dispatch_pool(POOL, idle_s=5))
    )
    loop.start()
    deadline = time.monotonic() + 5
    while not queue.redis.zcard(queue.keys.idle_loops(POOL)) and time.monotonic() < deadline:
        time.sleep(0.01)
    seats.stopping.set()  # the warm shutdown begins...
    job, summon = queue.enqueue_summoning(
        tenant="acme", pool=POOL, request_class="standard", prompt_tokens=10, max_tokens=20,
        kv_bytes=UNIT, payload=json.dumps(PAYLOAD),
    )  # fmt: skip
    assert summon is False  # ...as new work wakes the loop
    loop.join(timeout=5)
    assert done == [0]  # it did not start the job while its worker stops
    assert sent == [POOL]  # but summoned a loop (here or on another worker) for it
    fresh = queue.get_job(job.job_id)
    assert fresh is not None
    assert fresh.state == "queued"

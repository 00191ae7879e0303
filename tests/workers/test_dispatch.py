"""The dispatcher against the real Redis: a process holds as many runs at once as the fair
queue admits (the engine's seats), far beyond any thread count; every job runs once and is
released with its tokens, its answer and its ledger row; an idle picker is woken by new work
without a Celery message; a job cancelled while it runs is stopped; a stopping worker drains
its runs and gives back what is left. The engine is a stand-in coroutine: what is tested is
the dispatcher's bookkeeping, not the engine call (tests/e2e drive a real engine)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import redis

from fairqueue import EnginePolicy, FairQueue, Job, TenantPolicy
from fairqueue.aio import AsyncFairQueue
from scheduler.pools.policies import fair_queue
from telemetry.rejections import unreserved_prompt_tokens
from tenants.usage_buffer import outbox
from workers import dispatch as dispatch_module
from workers import tasks
from workers.dispatch import Dispatcher
from workers.runner import Run, RunResult

POOL = "m"
UNIT = 256 * 1024 * 1024
SEATS = 40  # far above the worker's thread count (8 in `make run`)
PAYLOAD = {"tenant_id": 7, "model": POOL, "endpoint": "chat", "stream": False,
           "body": {"user": "end-user-1"}}  # fmt: skip


@pytest.fixture
def queue(redis_db, settings) -> FairQueue:
    settings.GPUSHARE_DISPATCH_IDLE_S = 5.0
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(1, 100 * UNIT))
    queue.set_engine_policy(EnginePolicy("e1", POOL, 100 * UNIT, SEATS))
    return queue


class Engine:
    """Runs are held until `open` is set; records the most held at once."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.running = 0
        self.most = 0
        self.ran: list[str] = []
        self.stopped: list[str] = []

    async def run_picked(self, dispatcher: Dispatcher, run: Run) -> RunResult:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            while not self.open.is_set():
                if run.stopped:
                    self.stopped.append(run.job.job_id)
                    return RunResult(outcome="cancelled", finished_at=time.time())
                await asyncio.sleep(0.02)
            self.ran.append(run.job.job_id)
            return RunResult(
                outcome="success", prompt_tokens=10, completion_tokens=5, cached_tokens=8,
                finished_at=time.time(),
                done_event={"event": "done", "attempt": run.job.attempt},
            )  # fmt: skip
        finally:
            self.running -= 1


@pytest.fixture
def engine(monkeypatch) -> Engine:
    engine = Engine()
    monkeypatch.setattr(dispatch_module, "run_picked", engine.run_picked)
    return engine


@pytest.fixture
def summons(monkeypatch) -> list[str]:
    sent: list[str] = []
    monkeypatch.setattr(tasks.dispatch, "delay", sent.append)
    return sent


@pytest.fixture
def dispatcher():
    dispatcher = Dispatcher()
    yield dispatcher
    dispatcher.stop(drain_s=0)


def enqueue(queue: FairQueue, count: int) -> list[str]:
    return [submit(queue).job_id for _ in range(count)]


def submit(queue: FairQueue) -> Job:
    return queue.enqueue(
        tenant="acme", pool=POOL, request_class="standard", prompt_tokens=10, max_tokens=20,
        kv_bytes=UNIT, payload=json.dumps(PAYLOAD),
    )  # fmt: skip


def wait_until(predicate, timeout: float = 10.0) -> bool:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_process_fills_every_seat_of_its_engine_and_the_rest_waits_in_the_queue(
    queue, engine, dispatcher, summons
):
    ids = enqueue(queue, SEATS + 10)
    dispatcher.ensure(POOL)

    assert wait_until(lambda: engine.running == SEATS)
    time.sleep(0.3)  # no more than the seats, however long it runs
    assert engine.most == SEATS
    waiting = sum(row.waiting for row in queue.snapshot().queues)
    assert waiting == 10  # the backlog is in the fair queue, nowhere else
    engine.open.set()
    assert wait_until(lambda: len(engine.ran) == len(ids))
    assert sorted(engine.ran) == sorted(ids)  # each once
    assert wait_until(lambda: queue.snapshot().engine_inflight == {"e1": 0})
    assert queue.check().problems == []


def test_each_run_is_released_with_its_tokens_answer_and_ledger_row(
    queue, engine, dispatcher, summons
):
    engine.open.set()
    ids = enqueue(queue, 3)
    dispatcher.ensure(POOL)

    assert wait_until(lambda: dispatcher.ran == 3)
    for job_id in ids:
        job = queue.get_job(POOL, job_id)
        assert job is not None
        assert job.state == "done"
        assert queue.events(POOL, job_id)[-1]["event"] == "done"
    rows = [json.loads(row) for row in queue.redis.lrange(outbox(POOL), 0, -1)]
    assert sorted(row["request_id"] for row in rows) == sorted(ids)
    assert {(row["prompt_tokens"], row["completion_tokens"]) for row in rows} == {(10, 5)}
    assert {row["cached_tokens"] for row in rows} == {8}  # the engine's prefix-cache hits
    assert {row["end_user"] for row in rows} == {"end-user-1"}  # the body's `user`


def test_a_prompt_longer_than_its_reservation_is_counted_for_its_tenant(
    queue, engine, dispatcher, summons
):
    engine.open.set()
    short = queue.enqueue(
        tenant="acme", pool=POOL, request_class="standard", prompt_tokens=4, max_tokens=20,
        kv_bytes=UNIT, payload=json.dumps(PAYLOAD),
    )  # fmt: skip
    exact = submit(queue)  # reserved 10, as the engine counts
    dispatcher.ensure(POOL)
    assert wait_until(lambda: dispatcher.ran == 2)
    assert {short.job_id, exact.job_id} == set(engine.ran)
    assert wait_until(lambda: unreserved_prompt_tokens(queue.redis) == {"acme": 6})


def test_an_idle_picker_is_woken_by_new_work_without_a_message(queue, engine, dispatcher, summons):
    engine.open.set()
    dispatcher.ensure(POOL)
    time.sleep(0.3)  # nothing to run: the picker waits in Redis
    first = queue.enqueue_summoning(
        tenant="acme", pool=POOL, request_class="standard", prompt_tokens=1, max_tokens=1,
        kv_bytes=UNIT, payload=json.dumps(PAYLOAD),
    )  # fmt: skip
    assert first[1] is False  # a picker was idle: no message needed

    assert wait_until(lambda: engine.ran == [first[0].job_id])
    assert summons == []


def test_a_job_cancelled_while_it_runs_is_stopped(queue, engine, dispatcher, summons):
    (job_id,) = enqueue(queue, 1)
    dispatcher.ensure(POOL)
    assert wait_until(lambda: engine.running == 1)

    queue.cancel(POOL, job_id, reason="client_gone")

    assert wait_until(lambda: engine.stopped == [job_id], timeout=5)
    assert wait_until(lambda: dispatcher.ran == 1)
    assert queue.snapshot().engine_inflight == {"e1": 0}


def test_a_stopping_worker_drains_then_gives_back_what_is_left(queue, engine, dispatcher, summons):
    ids = enqueue(queue, 3)
    dispatcher.ensure(POOL)
    assert wait_until(lambda: engine.running == 3)

    dispatcher.stop(drain_s=0.2)

    for job_id in ids:
        job = queue.get_job(POOL, job_id)
        assert job is not None
        assert job.state == "queued"
        assert job.attempt == 1
    assert queue.snapshot().engine_inflight == {"e1": 0}


def test_a_summons_starts_the_picker_once_and_nudges_it_after(queue, engine, dispatcher, summons):
    engine.open.set()
    dispatcher.ensure(POOL)
    dispatcher.ensure(POOL)  # the second finds it running: a nudge
    ids = enqueue(queue, 2)  # enqueued without waking anyone (not enqueue_summoning)
    dispatcher.ensure(POOL)

    assert wait_until(lambda: sorted(engine.ran) == sorted(ids))


def test_a_picker_whose_pick_fails_tries_again_and_runs_the_work(
    queue, engine, dispatcher, summons, monkeypatch, caplog
):
    """A pick that Redis fails (away, failing over, short of replicas) neither kills the
    pool's picker nor leaves its work waiting for the next summons."""
    real_pick = AsyncFairQueue.pick
    failures: list[str] = []

    async def failing_twice(self, pool, *, loop=None):
        if len(failures) < 2:
            failures.append(pool)
            raise redis.ConnectionError("Redis is failing over")
        return await real_pick(self, pool, loop=loop)

    monkeypatch.setattr(AsyncFairQueue, "pick", failing_twice)
    engine.open.set()
    ids = enqueue(queue, 3)
    dispatcher.ensure(POOL)

    assert wait_until(lambda: sorted(engine.ran) == sorted(ids))
    assert failures == [POOL, POOL]
    assert "pick failed (Redis is failing over)" in caplog.text
    assert "dispatcher task failed" not in caplog.text


def test_a_job_sent_to_the_engine_holding_its_prefix_leaves_its_seat_to_the_next(
    queue, engine, dispatcher, summons, monkeypatch
):
    queue.set_engine_policy(EnginePolicy("e2", POOL, 100 * UNIT, SEATS))
    queue.redis.hset(queue.keys.pool_affinity(POOL), "k-a", "e2")  # e2 holds k-a's prefix
    ran = submit(queue)
    first = queue.pick(POOL, "e1")
    assert first is not None
    assert first.job_id == ran.job_id
    keyed = queue.enqueue(
        tenant="acme", pool=POOL, request_class="standard", prompt_tokens=10, max_tokens=20,
        kv_bytes=UNIT, payload=json.dumps(PAYLOAD), affinity="k-a",
    )  # fmt: skip
    plain = submit(queue)  # nothing wakes a picker: none runs yet
    engine.open.set()
    keyed_ends = threading.Event()  # the keyed job runs until the end of the test

    async def run_picked(dispatcher: Dispatcher, run: Run) -> RunResult:
        while run.job.job_id == keyed.job_id and not keyed_ends.is_set():
            await asyncio.sleep(0.02)
        return await engine.run_picked(dispatcher, run)

    monkeypatch.setattr(dispatch_module, "run_picked", run_picked)

    # The run on e1 ends; its release picks the keyed job for e1, which runs on e2, in the
    # same task. The seat it left on e1 goes to the next job, through the process's picker.
    dispatcher.run_soon(lambda d: d.chain(first, POOL))

    assert wait_until(lambda: sorted(engine.ran) == sorted([ran.job_id, plain.job_id]))
    keyed_now = queue.get_job(keyed.pool, keyed.job_id)
    assert keyed_now is not None
    assert (keyed_now.state, keyed_now.engine_id) == ("running", "e2")
    keyed_ends.set()

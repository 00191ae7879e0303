"""Lease renewal for running jobs, on the real Redis fair queue and Redis's own clock: the
dispatcher keeps every running job's lease alive, however long it runs, and a job reaped
from under it (its lease lapsed while the process stalled) is stopped, not finished twice."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import redis

from fairqueue import EnginePolicy, FairQueue, FairQueueConfig, Job, TenantPolicy
from workers import dispatch as dispatch_module
from workers.dispatch import Dispatcher
from workers.runner import Run, RunResult

UNIT = 256 * 1024 * 1024
LEASE_S = 1.5  # renewed every 0.5 s
PAYLOAD = json.dumps({"tenant_id": 7, "model": "p", "endpoint": "chat", "stream": False})


@pytest.fixture
def queue(redis_db: redis.Redis) -> FairQueue:
    queue = FairQueue(redis_db, FairQueueConfig(lease_s=LEASE_S))
    queue.set_tenant_policy("a", TenantPolicy(1, 4 * UNIT))
    queue.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 4))
    return queue


@pytest.fixture
def held(monkeypatch) -> tuple[threading.Event, list[str]]:
    """Runs last until the event is set; each records how it ended."""
    finish, ended = threading.Event(), []

    async def run_picked(dispatcher: Dispatcher, run: Run) -> RunResult:
        while not finish.is_set() and not run.stopped:
            await asyncio.sleep(0.02)
        ended.append(run.stopped or "finished")
        return RunResult(outcome="cancelled" if run.stopped else "success", finished_at=time.time())

    monkeypatch.setattr(dispatch_module, "run_picked", run_picked)
    return finish, ended


def running(queue: FairQueue, dispatcher: Dispatcher) -> Job:
    job = queue.enqueue(tenant="a", pool="p", request_class="standard", prompt_tokens=1,
                        max_tokens=1, kv_bytes=UNIT, payload=PAYLOAD)  # fmt: skip
    dispatcher.ensure("p")
    for _ in range(100):
        if job.job_id in dispatcher.runs:
            return job
        time.sleep(0.02)
    raise AssertionError("the job was not picked")


def test_a_running_job_s_lease_outlives_its_length(queue, held):
    finish, ended = held
    dispatcher = Dispatcher(queue=lambda: queue)
    try:
        job = running(queue, dispatcher)
        time.sleep(2 * LEASE_S)
        assert queue.reap_expired_leases() == []
        assert queue.job_state(job.pool, job.job_id) == ("running", 1)
        finish.set()
        for _ in range(100):
            if ended:
                break
            time.sleep(0.02)
        assert ended == ["finished"]
    finally:
        dispatcher.stop(drain_s=0)


def test_a_job_reaped_from_under_its_run_is_stopped(queue, held):
    _, ended = held
    dispatcher = Dispatcher(queue=lambda: queue)
    try:
        job = running(queue, dispatcher)
        # As if the process had stalled past the lease: the reaper gives the job back.
        assert queue.reap_expired_leases(now=time.time() + 10 * LEASE_S) == [job.job_id]
        for _ in range(100):
            if ended:
                break
            time.sleep(0.02)
        assert ended == ["lost"]
        # Not released by the stale run: its next attempt waits or runs (here, again).
        state = queue.job_state(job.pool, job.job_id)
        assert state in (("queued", 1), ("running", 2))
    finally:
        dispatcher.stop(drain_s=0)

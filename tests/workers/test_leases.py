"""Lease renewal for running jobs, on the real Redis fair queue and Redis's own clock: one
process thread keeps every running job's lease alive, stops when the job ends, and tells a
job that it was cancelled."""

from __future__ import annotations

import time

import redis

from scheduler.fairqueue import EnginePolicy, FairQueue, FairQueueConfig, Job, TenantPolicy
from workers.runner import LeaseKeeper

UNIT = 256 * 1024 * 1024
LEASE_S = 1.5  # renewed every 0.5 s


def running_job(redis_db: redis.Redis) -> tuple[FairQueue, Job]:
    queue = FairQueue(redis_db, FairQueueConfig(lease_s=LEASE_S))
    queue.set_tenant_policy("a", TenantPolicy(1, 4 * UNIT))
    queue.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 4))
    queue.enqueue(tenant="a", pool="p", request_class="standard", prompt_tokens=1,
                  max_tokens=1, kv_bytes=UNIT)  # fmt: skip
    job = queue.pick("p")
    assert job is not None
    return queue, job


def test_a_kept_lease_outlives_its_length_and_lapses_once_let_go(redis_db):
    queue, job = running_job(redis_db)
    keeper = LeaseKeeper(queue, job)
    time.sleep(2 * LEASE_S)
    assert queue.reap_expired_leases() == []
    assert keeper.still_ours()

    keeper.stop()
    time.sleep(LEASE_S + 0.7)
    assert queue.reap_expired_leases() == [job.job_id]
    assert not keeper.still_ours()


def test_a_cancelled_job_is_lost_to_its_keeper(redis_db):
    queue, job = running_job(redis_db)
    keeper = LeaseKeeper(queue, job)
    queue.cancel(job.job_id)
    assert keeper.lost.wait(timeout=2)
    keeper.stop()

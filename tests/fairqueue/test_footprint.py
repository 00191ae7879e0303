"""What the fair queue holds in Redis: what is waiting or in flight, and what finished only
for the finished-job window (`keep_s`); after it, a finished request leaves nothing behind
but what is kept per tenant and pool (its answer-length samples). A worker's turn picks for
the engine its job ran on, reading that engine alone however many the pool has; an enqueue
reads the pool's shape, kept current as engines come, change and go."""

from __future__ import annotations

import json
import time

import pytest
import redis

from fairqueue import EnginePolicy, FairQueue, FairQueueConfig, LastWords, TenantPolicy
from fairqueue.domain import JobRejected, payload_summary

UNIT = 256 * 1024 * 1024


def queue(fq_redis: redis.Redis, keep_s: int = 600) -> FairQueue:
    fq = FairQueue(fq_redis, FairQueueConfig(keep_s=keep_s))
    fq.set_tenant_policy("a", TenantPolicy(1, 64 * UNIT))
    fq.set_tenant_policy("b", TenantPolicy(1, 64 * UNIT))
    return fq


def enqueue(fq: FairQueue, tenant: str = "a", kv_bytes: int = UNIT) -> str:
    payload = {"tenant_id": 1, "model": "p", "body": {"messages": "x" * 2048}}
    job = fq.enqueue(
        tenant=tenant, pool="p", request_class="standard", prompt_tokens=100, max_tokens=50,
        kv_bytes=kv_bytes, payload=json.dumps(payload), summary=payload_summary(payload),
    )  # fmt: skip
    return job.job_id


def test_a_finished_request_leaves_nothing_once_its_window_has_passed(fq_redis):
    fq = queue(fq_redis, keep_s=1)
    fq.set_engine_policy(EnginePolicy("e1", "p", 64 * UNIT, 64))
    for _ in range(2):  # the pool's and the tenant's own keys exist from now on
        enqueue(fq, "b")
        first = fq.pick("p", "e1")
        assert first is not None
        fq.release(first.pool, first.job_id, 100, 10)
    time.sleep(1.2)
    keys_at_rest = set(fq_redis.keys("*"))

    words = LastWords(event={"event": "done"}, outbox="ledger", entry="row")
    for _ in range(50):
        released = enqueue(fq, "b")
        job = fq.pick("p", "e1")
        assert job is not None
        assert job.job_id == released
        fq.release(job.pool, job.job_id, 100, 10, last_words=words)
        assert 0 < fq_redis.ttl(fq.keys.job(job.pool, job.job_id)) <= 1
        assert 0 < fq_redis.ttl(fq.keys.events(job.pool, job.job_id)) <= 1
    cancelled = enqueue(fq, "b")
    fq.cancel("p", cancelled)
    fq_redis.delete("ledger")  # the ledger's flusher takes its rows

    # The answer-length samples stay a day: a tenant back after a pause is predicted.
    assert fq_redis.ttl(fq.keys.output_lengths("p", "b")) > 3600
    time.sleep(1.2)
    left = {k for k in fq_redis.keys("*") if fq_redis.exists(k)} - keys_at_rest
    assert left <= {
        fq.keys.output_lengths("p", "b"), fq.keys.output_predictions("p"),
    }  # fmt: skip


def test_a_workers_turn_picks_for_the_engine_its_job_ran_on(fq_redis):
    fq = queue(fq_redis)
    fq.set_engine_policy(EnginePolicy("small", "p", 2 * UNIT, 8))
    fq.set_engine_policy(EnginePolicy("large", "p", 64 * UNIT, 8))
    enqueue(fq)
    ran = fq.pick("p", "small")
    assert ran is not None
    following = enqueue(fq)

    # The large engine has far more room, but the room that appeared is the small one's.
    released, picked = fq.release_and_pick(ran, 100, 10, pool="p", same_engine=True)
    assert released
    assert picked is not None
    assert picked.job_id == following
    assert picked.engine_id == "small"

    # Asked without same_engine, the pool's engine with the most room gets it.
    enqueue(fq)
    _, scanned = fq.release_and_pick(picked, 100, 10, pool="p")
    assert scanned is not None
    assert scanned.engine_id == "large"


def test_a_workers_turn_gets_nothing_for_an_engine_that_left_the_pool(fq_redis):
    fq = queue(fq_redis)
    fq.set_engine_policy(EnginePolicy("e1", "p", 64 * UNIT, 8))
    fq.set_engine_policy(EnginePolicy("e2", "p", 64 * UNIT, 8))
    enqueue(fq)
    ran = fq.pick("p", "e1")
    assert ran is not None
    enqueue(fq)
    fq.remove_engine("e1")

    assert fq.release_and_pick(ran, 100, 10, pool="p", same_engine=True) == (True, None)
    assert fq.pick("p") is not None  # the job waits for the engine that is left


def test_an_enqueue_checks_against_the_pool_as_its_engines_change(fq_redis):
    fq = queue(fq_redis)
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 8))
    fq.set_engine_policy(EnginePolicy("e2", "p", 4 * UNIT, 8))
    enqueue(fq, kv_bytes=8 * UNIT)  # fits e1

    fq.set_engine_policy(EnginePolicy("e1", "p", 2 * UNIT, 8))  # e1 shrinks
    with pytest.raises(JobRejected) as larger:
        enqueue(fq, kv_bytes=8 * UNIT)
    assert larger.value.reason == "larger_than_engine"
    enqueue(fq, kv_bytes=4 * UNIT)  # fits e2

    fq.set_engine_policy(EnginePolicy("e2", "q", 4 * UNIT, 8))  # e2 moves to another pool
    fq.remove_engine("e1")
    with pytest.raises(JobRejected) as no_engine:
        enqueue(fq)
    assert no_engine.value.reason == "no_engine"

    # A shape lost (a Redis that kept the engines but not it) is computed again.
    fq.set_engine_policy(EnginePolicy("e3", "p", 16 * UNIT, 8))
    fq_redis.delete(fq.keys.pool_shape("p"))
    enqueue(fq, kv_bytes=16 * UNIT)
    assert fq_redis.hget(fq.keys.pool_shape("p"), "largest") == str(16 * UNIT)

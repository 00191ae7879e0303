"""Prefix-cache affinity (`lua/lib.lua` affinity_engine): the fair order chooses which job
runs, its affinity key where. A job runs on the engine that ran its key's latest job while
that engine can run it at once; else where it was chosen, which becomes its key's engine.
The model states the same rule (tests/fairqueue/test_differential.py compares them at
random); these cases pin each condition on the real scripts."""

import redis

from fairqueue import EnginePolicy, FairQueue, Job, TenantPolicy
from fairqueue.keys import Keys
from fairqueue.model import AFFINITY_SLACK

UNIT = 256 * 1024 * 1024


def setup_pool(fq: FairQueue, seats: int = 2, quota_units: int = 8) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, quota_units * UNIT))
    fq.set_tenant_policy("b", TenantPolicy(1, quota_units * UNIT))
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, seats))
    fq.set_engine_policy(EnginePolicy("e2", "p", 8 * UNIT, seats))


def submit(
    fq: FairQueue,
    tenant: str = "a",
    affinity: str = "k-a",
    kv_units: int = 1,
    cls: str = "standard",
) -> Job:
    return fq.enqueue(
        tenant=tenant, pool="p", request_class=cls, prompt_tokens=100, max_tokens=50,
        kv_bytes=kv_units * UNIT, now=0, affinity=affinity,
    )  # fmt: skip


def picked(fq: FairQueue, engine_id: str = "") -> Job:
    job = fq.pick("p", engine_id, now=1)
    assert job is not None
    return job


def affinity_map(fq: FairQueue, client: redis.Redis) -> dict[str, str]:
    flat = client.hgetall(Keys(fq.config.prefix).pool_affinity("p"))
    return {str(key): str(value) for key, value in flat.items()}


def test_a_job_runs_on_the_engine_that_ran_its_keys_latest_job(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    setup_pool(fq)
    submit(fq)
    first = picked(fq, "e1")
    assert first.engine_id == "e1"
    assert affinity_map(fq, fq_redis) == {"k-a": "e1"}
    fq.release(first.job_id, 100, 10, now=2)
    second = submit(fq)
    # Picked for e2, where a seat freed; e1 holds the prefix and has a seat: it runs there.
    job = picked(fq, "e2")
    assert (job.job_id, job.engine_id, job.affinity) == (second.job_id, "e1", "k-a")
    snap = fq.snapshot()
    assert snap.engine_reserved_bytes == {"e1": UNIT, "e2": 0}
    assert fq.check().ok


def test_a_full_holder_leaves_the_job_where_it_was_chosen_and_moves_the_key(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    setup_pool(fq, seats=1)
    submit(fq)
    first = picked(fq, "e1")
    submit(fq)
    # e1's only seat is taken: the next job of the key runs on e2, which now holds it.
    job = picked(fq, "e2")
    assert job.engine_id == "e2"
    assert affinity_map(fq, fq_redis) == {"k-a": "e2"}
    assert first.engine_id == "e1"
    assert fq.check().ok


def test_the_holder_needs_a_seat_not_a_place_in_its_queue(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 8 * UNIT))
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 1, queued=2))
    fq.set_engine_policy(EnginePolicy("e2", "p", 8 * UNIT, 1))
    submit(fq)
    assert picked(fq, "e1").engine_id == "e1"
    submit(fq)
    # e1 could hold it in its own queue, but it would wait there while e2's seat is free.
    assert picked(fq, "e2").engine_id == "e2"


def test_a_holder_busier_than_the_chosen_engine_by_more_than_the_slack_is_passed_over(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    setup_pool(fq, seats=8, quota_units=16)
    submit(fq)
    assert picked(fq, "e1").engine_id == "e1"
    for _ in range(AFFINITY_SLACK - 1):
        submit(fq, "b", affinity="")
        assert picked(fq, "e1").engine_id == "e1"
    submit(fq)  # e1 runs as many as the slack, e2 none: it goes to e1
    assert picked(fq, "e2").engine_id == "e1"
    submit(fq)  # now e1 runs one more than the slack allows
    assert picked(fq, "e2").engine_id == "e2"
    assert affinity_map(fq, fq_redis) == {"k-a": "e2"}


def test_a_holder_without_room_for_the_job_leaves_it_where_it_was_chosen(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    setup_pool(fq, seats=4, quota_units=16)
    submit(fq, kv_units=6)
    assert picked(fq, "e1").engine_id == "e1"
    submit(fq, kv_units=3)  # e1 has 2 units free
    assert picked(fq, "e2").engine_id == "e2"


def test_the_fair_order_still_chooses_the_job(fq: FairQueue, fq_redis: redis.Redis) -> None:
    setup_pool(fq, seats=4)
    submit(fq, "a", "k-a")
    assert picked(fq, "e1").engine_id == "e1"
    submit(fq, "b", "k-b")
    submit(fq, "a", "k-a")
    # b's counter is lower: b runs next, wherever; a's prefix does not put it first.
    job = picked(fq, "e2")
    assert (job.tenant, job.engine_id) == ("b", "e2")
    job = picked(fq, "e2")
    assert (job.tenant, job.engine_id) == ("a", "e1")


def test_a_job_without_a_key_runs_where_it_was_chosen(fq: FairQueue, fq_redis: redis.Redis) -> None:
    setup_pool(fq)
    submit(fq)
    assert picked(fq, "e1").engine_id == "e1"
    submit(fq, affinity="")
    assert picked(fq, "e2").engine_id == "e2"
    assert affinity_map(fq, fq_redis) == {"k-a": "e1"}


def test_an_engine_gone_from_the_pool_holds_nothing(fq: FairQueue, fq_redis: redis.Redis) -> None:
    setup_pool(fq)
    first = submit(fq)
    assert picked(fq, "e1").engine_id == "e1"
    fq.release(first.job_id, 100, 10, now=2)
    fq.remove_engine("e1")
    submit(fq)
    assert picked(fq, "e2").engine_id == "e2"
    assert affinity_map(fq, fq_redis) == {"k-a": "e2"}

"""Prefix-cache affinity (`lua/lib.lua` affinity_engine): the fair order chooses which job
runs, its affinity key where. A job runs on the engine that ran its key's latest job while
that engine can run it at once; else where it was chosen, which becomes its key's engine.
Where that engine cannot run it, a within-quota pick may give the seat to a job at most one
charge behind whose prefix the picking engine holds (AFFINITY_SCAN). The model states the
same rules (tests/fairqueue/test_differential.py compares them at random); these cases pin
each condition on the real scripts."""

import pytest
import redis

from fairqueue import EnginePolicy, FairQueue, Job, TenantPolicy
from fairqueue.keys import Keys
from fairqueue.model import AFFINITY_SCAN, AFFINITY_SLACK, token_charge

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
    fq.release(first.pool, first.job_id, 100, 10, now=2)
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
    fq.release(first.pool, first.job_id, 100, 10, now=2)
    fq.remove_engine("e1")
    submit(fq)
    assert picked(fq, "e2").engine_id == "e2"
    assert affinity_map(fq, fq_redis) == {"k-a": "e2"}


def both_engines_busy(fq: FairQueue, affinity: bool = True) -> tuple[Job, Job]:
    """One seat per engine: a runs on e1 and b on e2 (each engine then holds its tenant's
    key), and each tenant has one more job waiting. Returns the running jobs."""
    setup_pool(fq, seats=1)
    on_e1 = submit(fq, "a", "k-a" if affinity else "")
    assert picked(fq, "e1").engine_id == "e1"
    on_e2 = submit(fq, "b", "k-b" if affinity else "")
    assert picked(fq, "e2").engine_id == "e2"
    submit(fq, "a", "k-a" if affinity else "")
    submit(fq, "b", "k-b" if affinity else "")
    return on_e1, on_e2


def counter(fq: FairQueue, tenant: str) -> float:
    rows = [row for row in fq.snapshot(now=3).queues if row.tenant == tenant]
    return rows[0].counter


# A job's charge at the pick: 100 prompt tokens and 50 expected, at weight 1.
CHARGE = token_charge(100, 50, 1.0)


def test_a_seat_goes_to_a_job_within_one_charge_whose_prefix_the_engine_holds(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    on_e1, on_e2 = both_engines_busy(fq)
    # b's job ends having generated more than expected: b is now behind a in the fair
    # order, but by less than one charge of a's next job.
    fq.release(on_e2.pool, on_e2.job_id, 100, 100, now=2)
    assert counter(fq, "a") < counter(fq, "b") <= counter(fq, "a") + CHARGE
    # a is the fairest, but its prefix is on e1, which is full: e2's seat goes to b, whose
    # prefix e2 holds.
    job = picked(fq, "e2")
    assert (job.tenant, job.engine_id) == ("b", "e2")
    assert affinity_map(fq, fq_redis) == {"k-a": "e1", "k-b": "e2"}
    # a keeps its place: the next seat, on e1, where its prefix is, goes to it.
    fq.release(on_e1.pool, on_e1.job_id, 100, 50, now=2)
    job = picked(fq, "e1")
    assert (job.tenant, job.engine_id) == ("a", "e1")
    assert fq.check().ok


def test_a_job_more_than_one_charge_behind_does_not_take_the_seat(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    _, on_e2 = both_engines_busy(fq)
    fq.release(on_e2.pool, on_e2.job_id, 100, 200, now=2)
    assert counter(fq, "b") > counter(fq, "a") + CHARGE
    # b is more than a's charge behind: the fair order holds, a runs on e2 and moves its key.
    job = picked(fq, "e2")
    assert (job.tenant, job.engine_id) == ("a", "e2")
    assert affinity_map(fq, fq_redis) == {"k-a": "e2", "k-b": "e2"}
    assert fq.check().ok


def test_without_affinity_keys_the_fair_order_fills_the_seat(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    _, on_e2 = both_engines_busy(fq, affinity=False)
    fq.release(on_e2.pool, on_e2.job_id, 100, 100, now=2)
    assert counter(fq, "a") < counter(fq, "b") <= counter(fq, "a") + CHARGE
    job = picked(fq, "e2")
    assert (job.tenant, job.engine_id) == ("a", "e2")
    assert affinity_map(fq, fq_redis) == {}
    assert fq.check().ok


@pytest.mark.parametrize("between", [AFFINITY_SCAN - 1, AFFINITY_SCAN])
def test_the_pick_looks_at_most_affinity_scan_tenants_past_the_fairest(
    fq: FairQueue, fq_redis: redis.Redis, between: int
) -> None:
    setup_pool(fq, seats=1)
    fillers = [f"c{i}" for i in range(between)]
    for tenant in [*fillers, "z"]:
        fq.set_tenant_policy(tenant, TenantPolicy(1, 8 * UNIT))
    submit(fq, "a", "k-a")
    assert picked(fq, "e1").engine_id == "e1"
    on_e2 = submit(fq, "z", "k-z")
    assert picked(fq, "e2").engine_id == "e2"
    submit(fq, "a", "k-a")
    for tenant in fillers:
        submit(fq, tenant, affinity="")
    submit(fq, "z", "k-z")
    fq.release(on_e2.pool, on_e2.job_id, 100, 50, now=2)
    # Every counter is a's: the backlog's order is a, the fillers, z (ties by name).
    assert {counter(fq, tenant) for tenant in ["a", *fillers, "z"]} == {counter(fq, "a")}
    job = picked(fq, "e2")
    expected = "z" if between < AFFINITY_SCAN else "a"
    assert (job.tenant, job.engine_id) == (expected, "e2")
    assert fq.check().ok


@pytest.mark.parametrize("head_key", ["k-z", "k-other"])
def test_a_tenant_whose_jobs_carry_different_keys_is_judged_by_its_head(
    fq: FairQueue, fq_redis: redis.Redis, head_key: str
) -> None:
    # A pick looking past the fairest tenant passes over one whose queue's key another engine
    # holds without reading the queue (`qkeys`); a queue whose jobs' keys differ is read.
    setup_pool(fq, seats=1)
    fq.set_tenant_policy("z", TenantPolicy(1, 8 * UNIT))
    submit(fq, "a", "k-a")
    assert picked(fq, "e1").engine_id == "e1"
    on_e2 = submit(fq, "z", "k-z")
    assert picked(fq, "e2").engine_id == "e2"
    submit(fq, "a", "k-a")
    tail_key = "k-other" if head_key == "k-z" else "k-z"
    head = submit(fq, "z", head_key)
    submit(fq, "z", tail_key)
    hints = fq_redis.hgetall(Keys(fq.config.prefix).queue_keys("p", "standard"))
    assert {str(k): str(v) for k, v in hints.items()} == {"a": "k-a", "z": "*"}
    fq.release(on_e2.pool, on_e2.job_id, 100, 50, now=2)
    assert counter(fq, "z") == counter(fq, "a")
    job = picked(fq, "e2")
    if head_key == "k-z":  # e2 holds the head's prefix: z's job runs in a's place
        assert (job.job_id, job.engine_id) == (head.job_id, "e2")
    else:  # the head's key is nobody's here: the fairest runs
        assert (job.tenant, job.engine_id) == ("a", "e2")
    assert fq.check().ok

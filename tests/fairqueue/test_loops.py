"""Dispatch loops and the fair queue: new work wakes a loop that waits for it, or asks for one
to be summoned (once per burst: the summoned loop fans out), on the real Redis."""

import threading
import time
from typing import Any

import redis

from fairqueue import FairQueue
from fairqueue.domain import DispatchLoop, FairQueueConfig, Job
from tests.fairqueue.test_lifecycle import UNIT, setup_pool

FIELDS: dict[str, Any] = {"pool": "p", "request_class": "standard", "prompt_tokens": 100,
                          "max_tokens": 50, "kv_bytes": UNIT}  # fmt: skip


def arrive(fq: FairQueue, tenant: str = "a", now: float = 0) -> tuple[Job, bool]:
    return fq.enqueue_summoning(tenant=tenant, now=now, **FIELDS)


def idle_loop(fq: FairQueue, token: str, now: float = 0) -> DispatchLoop:
    """A loop that started, found nothing to run, and now waits."""
    loop = DispatchLoop(token=token)
    assert fq.pick("p", loop=loop, now=now) is None
    return loop


def test_new_work_wakes_the_loop_that_waits_instead_of_asking_for_a_new_one(fq: FairQueue):
    setup_pool(fq)
    loop = idle_loop(fq, "l1")

    job, summon = arrive(fq, now=1)

    assert summon is False  # handed to the waiting loop: no Celery message
    started = time.monotonic()
    assert fq.wait_for_work("p", loop, timeout_s=5) is True
    assert time.monotonic() - started < 1  # woken, not timed out
    picked = fq.pick("p", loop=loop, now=2)
    assert picked is not None
    assert picked.job_id == job.job_id


def test_the_loop_that_went_idle_last_is_woken_first(fq: FairQueue, fq_redis: redis.Redis):
    setup_pool(fq)
    first, last = idle_loop(fq, "old", now=0), idle_loop(fq, "new", now=0.5)

    arrive(fq, now=1)

    assert fq_redis.llen(fq.keys.loop_wake("p", last.token)) == 1
    assert fq_redis.llen(fq.keys.loop_wake("p", first.token)) == 0
    # The other one times out and leaves: as many loops stay as the traffic needs.
    assert fq.wait_for_work("p", first, timeout_s=0.05) is False
    assert fq_redis.zcard(fq.keys.idle_loops("p")) == 0


def test_a_burst_summons_one_loop_which_fans_out_while_work_waits(fq: FairQueue):
    setup_pool(fq)

    answers = [arrive(fq, now=0)[1] for _ in range(3)]

    assert answers == [True, False, False]  # one message for the burst
    first = DispatchLoop(token="l1")
    assert fq.pick("p", loop=first, now=1) is not None
    assert first.summon_next is True  # two more wait and no loop is idle: summon the next
    second = DispatchLoop(token="l2")
    assert fq.pick("p", loop=second, now=1) is not None
    assert second.summon_next is True
    third = DispatchLoop(token="l3")
    assert fq.pick("p", loop=third, now=1) is not None
    assert third.summon_next is False  # nothing is left waiting
    # A loop past its first pick does not fan out: only started loops do.
    arrive(fq, now=2)
    assert fq.pick("p", loop=first, now=2) is not None
    assert first.summon_next is False


def test_a_summons_whose_loop_never_started_lapses(fq: FairQueue):
    setup_pool(fq)
    assert arrive(fq, now=0)[1] is True
    assert arrive(fq, now=0)[1] is False
    ttl = fq.redis.ttl(fq.keys.loop_summoned("p"))
    assert 0 < ttl <= fq.config.loop_summon_s  # it lapses by itself
    fq.redis.delete(fq.keys.loop_summoned("p"))  # as that TTL does
    assert arrive(fq, now=0)[1] is True


def test_a_loop_that_waited_in_vain_leaves_and_new_work_asks_for_a_loop(fq: FairQueue):
    setup_pool(fq)
    loop = idle_loop(fq, "l1")

    assert fq.wait_for_work("p", loop, timeout_s=0.05) is False

    assert arrive(fq, now=1)[1] is True


def test_a_client_read_timeout_during_the_wait_counts_as_no_wake_up(fq: FairQueue):
    """redis-py 8 times a read out after 5 s by default: on a machine stalled that long, the
    wait must end as one in vain, not crash the loop. Here the client's timeout is shorter
    than the wait, so the read times out for real."""
    setup_pool(fq)
    loop = idle_loop(fq, "l1")
    url = fq.redis.connection_pool.connection_kwargs
    impatient = redis.Redis(
        host=url["host"], port=url["port"], db=url["db"], decode_responses=True,
        socket_timeout=0.1,
    )  # fmt: skip
    try:
        waiting = FairQueue(impatient, fq.config)
        assert waiting.wait_for_work("p", loop, timeout_s=1) is False
    finally:
        impatient.close()
    assert arrive(fq, now=1)[1] is True  # the loop left: new work asks for one


def test_a_wake_up_that_comes_as_the_wait_times_out_is_not_lost(fq: FairQueue):
    setup_pool(fq)
    loop = idle_loop(fq, "l1")
    arrive(fq, now=1)  # wakes it, but it is leaving
    assert fq.stop_waiting("p", loop) is True  # so it picks again (or summons a loop)


def test_a_loop_that_died_waiting_is_forgotten_at_its_deadline(fq: FairQueue):
    setup_pool(fq)
    idle_loop(fq, "dead", now=0)  # never waits, never leaves

    # After loop_idle_s the entry is gone: the work is not handed to nobody.
    assert arrive(fq, now=fq.config.loop_idle_s + 0.1)[1] is True


def test_a_freed_seat_wakes_a_waiting_loop(fq: FairQueue, fq_redis: redis.Redis):
    setup_pool(fq, max_num_seqs=1)
    arrive(fq, now=0)
    running = fq.pick("p", now=0)
    assert running is not None
    arrive(fq, "b", now=0)
    loop = idle_loop(fq, "l1", now=1)  # the engine's one seat is taken: nothing to run

    fq.cancel(running.pool, running.job_id, now=2)

    assert fq_redis.llen(fq.keys.loop_wake("p", loop.token)) == 1
    following = fq.pick("p", loop=loop, now=3)
    assert following is not None
    assert following.tenant == "b"


def test_plain_enqueue_leaves_the_loops_alone(fq: FairQueue, fq_redis: redis.Redis):
    setup_pool(fq)
    loop = idle_loop(fq, "l1")
    fq.enqueue(tenant="a", now=1, **FIELDS)  # e.g. the batch feeder, which sends its own
    assert fq_redis.llen(fq.keys.loop_wake("p", loop.token)) == 0
    assert not fq_redis.exists(fq.keys.loop_summoned("p"))


def test_a_loop_waiting_longer_than_its_registration_renews_it_and_is_still_woken(
    fq_redis: redis.Redis,
):
    """Loops wait a minute, but are registered for seconds at a time (a dead one is soon
    forgotten): each slice of the wait renews the registration."""
    fq = FairQueue(fq_redis, FairQueueConfig(loop_idle_s=0.3))
    setup_pool(fq)
    loop = DispatchLoop(token="patient")
    assert fq.pick("p", loop=loop) is None  # registered for 0.3 s, on Redis' clock
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(fq.wait_for_work("p", loop, 5.0)))
    waiter.start()
    time.sleep(1.0)  # three registrations' worth

    job, summon = fq.enqueue_summoning(tenant="a", **FIELDS)

    assert summon is False  # handed to the waiting loop
    waiter.join(timeout=5)
    assert woken == [True]
    picked = fq.pick("p", loop=loop)
    assert picked is not None
    assert picked.job_id == job.job_id


def test_housekeeping_s_kick_wakes_an_idle_loop_and_asks_for_a_message_only_without_one(
    fq: FairQueue, fq_redis: redis.Redis
):
    setup_pool(fq)
    loop = idle_loop(fq, "l1", now=time.time())  # kick runs on Redis' clock
    assert fq.kick("p") is False  # the waiting loop is woken: no message
    assert fq_redis.llen(fq.keys.loop_wake("p", loop.token)) == 1
    assert fq.kick("p") is True  # no loop waits now: summon one
    assert fq.kick("p") is False  # once: the summoned loop has not started yet

"""A job's life: timeouts, leases and the reaper, release, cancel, requeue, the waiter's
events, and the invariant check."""

import json

import redis
from redis.crc import key_slot

from fairqueue import EnginePolicy, FairQueue, FairQueueConfig, Job, LastWords, TenantPolicy
from fairqueue.domain import DispatchLoop, payload_summary
from fairqueue.keys import Keys

UNIT = 256 * 1024 * 1024


def setup_pool(fq: FairQueue, max_num_seqs: int = 8) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 4 * UNIT))
    fq.set_tenant_policy("b", TenantPolicy(1, 4 * UNIT))
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, max_num_seqs))


def submit(
    fq: FairQueue, tenant: str = "a", request_class: str = "standard", now: float = 0
) -> Job:
    return fq.enqueue(
        tenant=tenant,
        pool="p",
        request_class=request_class,
        prompt_tokens=100,
        max_tokens=50,
        kv_bytes=UNIT,
        now=now,
    )


def pick(fq: FairQueue, now: float) -> Job:
    job = fq.pick("p", "e1", now=now)
    assert job is not None
    return job


def reserved(fq: FairQueue) -> tuple[int, int, int]:
    snap = fq.snapshot()
    return (
        snap.tenant_reserved_bytes["a"],
        snap.engine_reserved_bytes["e1"],
        snap.engine_inflight["e1"],
    )


def events(fq: FairQueue, job_id: str) -> list[dict[str, object]]:
    found = []
    while (event := fq.wait_event("p", job_id, 0.01)) is not None:
        found.append(event)
    return found


def test_an_interactive_job_expires_after_its_queue_timeout_and_its_waiter_is_told(
    fq: FairQueue,
) -> None:
    setup_pool(fq)
    job = submit(fq, request_class="interactive", now=0)
    assert fq.expire_waiting(now=29.9) == []
    assert fq.expire_waiting(now=30.0) == [job.job_id]
    assert fq.get_job(job.pool, job.job_id).state == "expired"  # type: ignore[union-attr]
    [event] = events(fq, job.job_id)
    assert event["event"] == "expired"
    assert event["reason"] == "queue_timeout"
    assert event["waited_s"] == 30
    assert fq.pick("p", "e1", now=31) is None
    assert fq.check().ok


def test_a_pick_never_hands_out_a_job_past_its_deadline(fq: FairQueue) -> None:
    setup_pool(fq)
    stale = submit(fq, request_class="interactive", now=0)
    fresh = submit(fq, request_class="standard", now=0)
    assert pick(fq, now=45).job_id == fresh.job_id  # interactive would go first, had it lived
    assert fq.get_job(stale.pool, stale.job_id).state == "expired"  # type: ignore[union-attr]


def test_a_pick_scans_past_many_expired_heads(fq: FairQueue) -> None:
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 8))
    for i in range(40):  # more than a page of the backlog
        fq.set_tenant_policy(f"t{i:02}", TenantPolicy(1, UNIT))
        fq.enqueue(tenant=f"t{i:02}", pool="p", request_class="interactive", prompt_tokens=1,
                   max_tokens=1, kv_bytes=UNIT, now=0)  # fmt: skip
    fq.set_tenant_policy("t20x", TenantPolicy(1, UNIT))  # in the middle of the backlog
    late = fq.enqueue(tenant="t20x", pool="p", request_class="interactive", prompt_tokens=1,
                      max_tokens=1, kv_bytes=UNIT, now=50)  # fmt: skip
    assert pick(fq, now=60).job_id == late.job_id
    assert fq.check().ok


def test_without_now_the_scripts_use_redis_clock(fq: FairQueue, fq_redis: redis.Redis) -> None:
    setup_pool(fq)
    seconds, micros = fq_redis.time()
    job = fq.enqueue(tenant="a", pool="p", request_class="interactive", prompt_tokens=1,
                     max_tokens=1, kv_bytes=UNIT)  # fmt: skip
    assert abs(job.enqueued_at - (seconds + micros / 1e6)) < 5
    assert job.deadline == job.enqueued_at + 30


def test_each_class_has_its_own_timeout(fq_redis: redis.Redis) -> None:
    timeouts = {"interactive": 1.0, "standard": 2.0, "offline": 3.0}
    fq = FairQueue(fq_redis, FairQueueConfig(queue_timeouts_s=timeouts))
    setup_pool(fq)
    jobs = {name: submit(fq, request_class=name) for name in timeouts}
    assert fq.expire_waiting(now=1) == [jobs["interactive"].job_id]
    assert fq.expire_waiting(now=2) == [jobs["standard"].job_id]
    assert fq.expire_waiting(now=3) == [jobs["offline"].job_id]


def test_the_reaper_returns_an_expired_lease_to_the_head_and_frees_it(fq: FairQueue) -> None:
    setup_pool(fq)
    first, second = submit(fq), submit(fq)
    leased = pick(fq, now=1)
    assert leased.job_id == first.job_id
    assert leased.lease_deadline == 121
    assert reserved(fq) == (UNIT, UNIT, 1)
    assert fq.reap_expired_leases(now=120) == []
    assert fq.reap_expired_leases(now=121) == [first.job_id]
    assert reserved(fq) == (0, 0, 0)
    assert fq.check().ok
    again = pick(fq, now=122)
    assert again.job_id == first.job_id  # the head, before `second`
    assert again.attempt == 2
    assert [e["event"] for e in events(fq, first.job_id)] == ["requeued"]  # a pick says nothing
    assert fq.get_job(second.pool, second.job_id).state == "queued"  # type: ignore[union-attr]


def test_a_stale_worker_cannot_release_the_next_attempt(fq: FairQueue) -> None:
    setup_pool(fq)
    job = submit(fq)
    first_attempt = pick(fq, now=1)
    fq.reap_expired_leases(now=500)
    pick(fq, now=501)
    assert not fq.release(job.pool, job.job_id, 100, 50, attempt=first_attempt.attempt, now=502)
    assert not fq.renew_lease(job.pool, job.job_id, first_attempt.attempt, now=502)
    assert fq.get_job(job.pool, job.job_id).state == "running"  # type: ignore[union-attr]
    assert fq.release(job.pool, job.job_id, 100, 50, attempt=2, now=503)


def test_renewing_a_lease_keeps_the_reaper_away(fq: FairQueue) -> None:
    setup_pool(fq)
    submit(fq)
    job = pick(fq, now=0)
    assert fq.renew_lease(job.pool, job.job_id, job.attempt, now=100)
    assert fq.reap_expired_leases(now=150) == []
    assert fq.reap_expired_leases(now=220) == [job.job_id]


def test_release_is_idempotent_and_charges_the_real_tokens(fq: FairQueue) -> None:
    setup_pool(fq)
    submit(fq)
    job = pick(fq, now=1)
    assert job.charged == 100 + 2 * 50  # the estimate: prompt + 2 x max_tokens
    assert fq.release(job.pool, job.job_id, 100, 20, now=2)
    assert not fq.release(job.pool, job.job_id, 100, 20, now=3)
    assert not fq.release("p", "never-was", 1, 1, now=3)
    assert fq.get_job(job.pool, job.job_id).charged == 100 + 2 * 20  # type: ignore[union-attr]
    [row] = fq.snapshot().queues
    assert row.counter == 140
    assert reserved(fq) == (0, 0, 0)
    assert fq.check().ok


def test_cancelling_a_queued_job_removes_it_and_tells_the_waiter(fq: FairQueue) -> None:
    setup_pool(fq)
    job = submit(fq)
    assert fq.cancel(job.pool, job.job_id, reason="client_disconnected", now=1) == "queued"
    assert fq.cancel(job.pool, job.job_id, now=2) == ""
    assert fq.pick("p", "e1", now=3) is None
    assert events(fq, job.job_id) == [
        {"event": "cancelled", "reason": "client_disconnected", "at": 1}
    ]
    assert fq.check().ok


def test_cancelling_a_running_job_frees_everything(fq: FairQueue) -> None:
    setup_pool(fq)
    submit(fq)
    job = pick(fq, now=1)
    assert fq.cancel(job.pool, job.job_id, now=2) == "running"
    assert reserved(fq) == (0, 0, 0)
    assert not fq.release(job.pool, job.job_id, 100, 50, now=3)
    assert not fq.renew_lease(job.pool, job.job_id, job.attempt, now=3)
    assert fq.get_job(job.pool, job.job_id).charged == 100  # type: ignore[union-attr]
    assert fq.check().ok


def test_a_requeued_job_refunds_its_estimate_and_goes_first(fq: FairQueue) -> None:
    setup_pool(fq)
    first, second = submit(fq), submit(fq)
    assert pick(fq, now=1).job_id == first.job_id
    assert fq.requeue(first.pool, first.job_id, reason="engine_gone", now=2)
    assert not fq.requeue(first.pool, first.job_id, now=2)
    assert reserved(fq) == (0, 0, 0)
    [row] = fq.snapshot().queues
    assert row.counter == 0
    assert row.waiting == 2
    assert pick(fq, now=3).job_id == first.job_id
    assert fq.get_job(second.pool, second.job_id).state == "queued"  # type: ignore[union-attr]


def test_a_worker_publishes_to_the_same_channel_the_waiter_reads(fq: FairQueue) -> None:
    setup_pool(fq)
    submit(fq)
    job = pick(fq, now=1)
    fq.publish(job.pool, job.job_id, {"event": "chunk", "text": "hel"})
    fq.publish(job.pool, job.job_id, {"event": "done"})
    assert [e["event"] for e in events(fq, job.job_id)] == ["chunk", "done"]


def test_the_check_reports_drift_and_repairs_it(fq: FairQueue, fq_redis: redis.Redis) -> None:
    setup_pool(fq)
    submit(fq)
    pick(fq, now=1)
    keys = Keys()
    fq_redis.hincrby(keys.lease("p", "a"), "held", 7)
    fq_redis.hincrby(keys.engine_usage("p", "e1"), "inflight", 1)
    report = fq.check()
    assert not report.ok
    assert report.tenant_reserved["a"] == (UNIT + 7, UNIT)
    assert len(report.problems) == 2
    assert fq.check(repair=True).repaired
    assert fq.check().ok
    assert reserved(fq) == (UNIT, UNIT, 1)


def test_the_status_shows_waiting_running_and_oldest_wait(fq: FairQueue) -> None:
    setup_pool(fq)
    submit(fq, "a", now=0)
    submit(fq, "a", now=5)
    submit(fq, "b", request_class="interactive", now=8)
    pick(fq, now=9)  # interactive first
    rows = {(r.request_class, r.tenant): r for r in fq.snapshot(now=10).queues}
    assert rows[("standard", "a")].waiting == 2
    assert rows[("standard", "a")].oldest_wait_s == 10
    assert rows[("interactive", "b")].running == 1
    assert rows[("interactive", "b")].waiting == 0


def test_the_cheap_reads_agree_with_the_snapshot(fq: FairQueue) -> None:
    """Housekeeping and the sampler read the pools with waiting work and each engine's
    reservations without the snapshot's round trip per job and per queue."""
    setup_pool(fq)
    fq.set_engine_policy(EnginePolicy("e2", "quiet", 8 * UNIT, 8))
    assert fq.pools_with_waiting_work() == []
    submit(fq, "a", now=0)
    submit(fq, "b", request_class="interactive", now=1)
    assert fq.pools_with_waiting_work() == ["p"]
    pick(fq, now=2)
    assert fq.pools_with_waiting_work() == ["p"]  # a's job still waits
    assert fq.engine_reserved_bytes() == {"e1": UNIT, "e2": 0}
    assert fq.engine_reserved_bytes() == fq.snapshot().engine_reserved_bytes
    pick(fq, now=3)
    assert fq.pools_with_waiting_work() == []
    assert fq.engine_reserved_bytes() == {"e1": 2 * UNIT, "e2": 0}


def test_the_scripts_and_keys_py_name_the_same_keys(fq: FairQueue, fq_redis: redis.Redis) -> None:
    setup_pool(fq)
    job = submit(fq)
    keys = Keys()
    for name in (
        keys.job("p", job.job_id),
        keys.queue("p", "standard", "a"),
        keys.backlog("p", "standard"),
        keys.counters("p", "standard"),
        keys.waiting("p"),
        keys.pools(),
    ):
        assert fq_redis.exists(name), name
    pick(fq, now=1)
    for name in (
        keys.inflight("p"),
        keys.lease("p", "a"),
        keys.lease_quota("a"),
        keys.engine_usage("p", "e1"),
        keys.class_clock("p"),
    ):
        assert fq_redis.exists(name), name
    fq.cancel(job.pool, job.job_id, reason="client_gone")  # the waiter is told
    assert fq_redis.exists(keys.events(job.pool, job.job_id))
    # A job released with its time to first token, on an engine with a target for its class,
    # leaves both the class's seated stamp (its stamp is over 0: its tenant ran one before)
    # and the engine's samples.
    target = EnginePolicy("e1", "p", 8 * UNIT, 8, ttft_targets_s={"interactive": 1.0})
    fq.set_engine_policy(target)
    submit(fq, request_class="interactive", now=2)
    fq.release("p", pick(fq, now=3).job_id, 10, 1, last_words=LastWords(ttft_s=0.5), now=4)
    submit(fq, request_class="interactive", now=5)
    second = pick(fq, now=6)
    assert second.stamp > 0
    fq.release(second.pool, second.job_id, 10, 1, last_words=LastWords(ttft_s=0.5), now=7)
    for name in (keys.seated("p", "interactive"), keys.engine_ttfts("p", "e1", "interactive")):
        assert fq_redis.exists(name), name


def test_release_and_pick_releases_once_and_hands_over_the_next_job_in_one_step(
    fq: FairQueue,
) -> None:
    setup_pool(fq, max_num_seqs=1)
    first, second = submit(fq, now=0), submit(fq, "b", now=0)
    running = pick(fq, now=1)
    assert running.job_id == first.job_id

    released, following = fq.release_and_pick(running, 100, 20, pool="p", now=2)

    assert released
    assert following is not None
    assert (following.job_id, following.engine_id, following.state) == (
        second.job_id, "e1", "running",
    )  # fmt: skip
    assert fq.get_job(first.pool, first.job_id).state == "done"  # type: ignore[union-attr]
    assert reserved(fq) == (0, UNIT, 1)  # only b's job holds anything now
    # Released already: a second turn releases nothing, and nothing is left to pick.
    assert fq.release_and_pick(running, 100, 20, pool="p", now=3) == (False, None)
    assert fq.check().ok


def test_job_state_reads_state_and_attempt_only(fq: FairQueue) -> None:
    setup_pool(fq)
    job = submit(fq, now=0)
    assert fq.job_state(job.pool, job.job_id) == ("queued", 0)
    running = pick(fq, now=1)
    assert fq.job_state(job.pool, job.job_id) == ("running", running.attempt)
    assert fq.job_state("p", "no-such-job") is None


def test_a_job_that_is_over_keeps_its_summary_not_its_request_body(fq: FairQueue) -> None:
    setup_pool(fq)
    payload = {"tenant_id": 7, "model": "m", "body": {"messages": "x" * 1_000_000}}
    summary = payload_summary(payload)

    def job(request_class: str = "standard") -> Job:
        return fq.enqueue(tenant="a", pool="p", request_class=request_class, prompt_tokens=1,
                          max_tokens=1, kv_bytes=1, payload=json.dumps(payload), now=0,
                          summary=summary)  # fmt: skip

    released = job()
    picked = fq.pick("p", "e1", now=1)
    assert picked is not None
    assert picked.job_id == released.job_id
    assert json.loads(picked.payload) == payload  # whole while it runs
    cancelled, expired = job(), job("interactive")
    fq.release(released.pool, released.job_id, 1, 1, now=2)
    fq.cancel(cancelled.pool, cancelled.job_id)
    fq.expire_waiting(now=10_000)
    for over in (released, cancelled, expired):
        kept = fq.get_job(over.pool, over.job_id)
        assert kept is not None
        assert json.loads(kept.payload) == {"tenant_id": 7, "model": "m"}  # the ledger's


def test_a_job_of_several_sequences_takes_a_seat_for_each(fq: FairQueue) -> None:
    setup_pool(fq, max_num_seqs=4)
    wide = fq.enqueue(
        tenant="a", pool="p", request_class="standard", prompt_tokens=100, max_tokens=150,
        kv_bytes=UNIT, now=0, seqs=3,
    )  # fmt: skip
    assert wide.seqs == 3
    narrow, last = submit(fq, "b", now=0), submit(fq, "b", now=0)
    assert pick(fq, now=1).job_id == wide.job_id
    assert reserved(fq)[2] == 3
    assert pick(fq, now=1).job_id == narrow.job_id  # one seat was free
    assert fq.pick("p", "e1", now=1) is None  # four of four taken
    running = fq.get_job(wide.pool, wide.job_id)
    assert running is not None
    assert running.seqs == 3
    assert fq.release(running.pool, running.job_id, 100, 150, now=2)
    assert fq.snapshot().engine_inflight["e1"] == 1
    assert pick(fq, now=3).job_id == last.job_id
    assert fq.check().ok


def test_every_key_a_pools_decisions_make_is_in_the_pools_slot(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    """A pool's decisions touch one hash slot, its tag's (`{p:<pool>}`): every key they
    leave is in it, but for the indexes, the tenants' policies the pools' copies are made
    from, and the tenants' own slots of their quota leases (`{t:<t>}:quota`), which the
    decisions never touch: the leases are asked for between them."""
    keys = Keys()
    setup_pool(fq)
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 8, ttft_targets_s={"interactive": 1.0}))
    fq.set_engine_policy(EnginePolicy("e2", "p", 8 * UNIT, 8, reservation="predict"))
    inbox = keys.inbox("p", "web")
    waited = fq.enqueue_args(
        summon=True, tenant="a", pool="p", request_class="interactive", prompt_tokens=10,
        max_tokens=10, kv_bytes=UNIT, inbox=inbox, kv_floor=UNIT // 2, kv_token=1,
        observed=True, affinity="a",
    )  # fmt: skip
    fq.enqueue_answer(fq._run("enqueue", "p", *waited, now=0), waited)
    expiring = submit(fq, "b", request_class="interactive", now=0)
    assert set(fq.expire_waiting(now=100, pool="p")) == {waited[0], expiring.job_id}
    loop = DispatchLoop(token="loop1")
    assert fq.pick("p", loop=loop, now=101) is None  # registered idle
    assert not fq.stop_waiting("p", loop)
    fq.kick("p")
    first, second, third = (submit(fq, t, request_class="standard", now=102) for t in "aba")
    fq.cancel("p", third.job_id, now=103)
    running = pick(fq, now=103)
    fq.renew_lease("p", running.job_id, running.attempt, now=104)
    fq.grow("p", running.job_id, running.attempt, 10, now=104)
    fq.publish("p", running.job_id, {"event": "chunk", "text": "x"})
    fq._run("answer", "p", running.job_id, "{}", keys.inbox("p", "worker"), "1")
    ledger = LastWords(event={"event": "done"}, outbox=keys.ledger("p"), entry="row", ttft_s=0.5)
    _, following = fq.release_and_pick(running, 10, 5, pool="p", now=105, last_words=ledger)
    assert following is not None
    assert fq.requeue("p", following.job_id, attempt=following.attempt, now=106)
    reaped = pick(fq, now=107)
    ended = 107 + fq.config.lease_s + 1
    assert fq.reap_expired_leases(now=ended, pool="p") == [reaped.job_id]
    fq.release("p", pick(fq, now=ended).job_id, 10, 5, last_words=ledger, now=ended)
    for _ in range(2):  # the second run's stamp is over 0: it leaves the seated stamp
        submit(fq, "a", request_class="interactive", now=ended)
        seated = pick(fq, now=ended)
        fq.release("p", seated.job_id, 10, 5, last_words=LastWords(ttft_s=0.5), now=ended)
    for tenant in "ab":  # one runs, one waits: the indexes, queues and backlogs stay
        fq.enqueue(tenant=tenant, pool="p", request_class="interactive", prompt_tokens=10,
                   max_tokens=10, kv_bytes=UNIT, affinity=tenant, now=ended)  # fmt: skip
    pick(fq, now=ended)
    fq.set_engine_load("p", "e1", 0.5, "kv_cache_usage", kv_usage=0.5, preempted=1, now=203)
    assert fq.check(repair=True).ok

    slot = key_slot(keys.pool_tag("p").encode())
    elsewhere = {key for key in fq_redis.keys("*") if key_slot(str(key).encode()) != slot}
    indexes = {keys.pools(), keys.engines(), keys.tenants()}
    policies = {keys.tenant_policy(t) for t in "ab"}
    assert elsewhere == indexes | policies | {keys.lease_quota(t) for t in "ab"}
    left = {
        keys.inflight("p"), keys.waiting("p"), keys.queue("p", "interactive", "b"),
        keys.backlog("p", "interactive"), keys.seated("p", "interactive"),
        keys.engine_ttfts("p", "e1", "interactive"), keys.pool_affinity("p"), keys.ledger("p"),
        keys.inbox("p", "worker"), keys.job("p", first.job_id), keys.job("p", second.job_id),
    }  # fmt: skip
    assert left <= set(fq_redis.keys("*"))


def test_a_tenant_refused_a_lease_is_passed_over_and_housekeeping_brings_its_quota_back(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    """A tenant's first pick in a pool asks for its lease there. Where its quota is leased
    to another pool, the pick passes it over for the next tenant, who asks in turn, and the
    pool is recorded starved; housekeeping's rebalance brings back what the other pool does
    not hold, and the next pick gets it."""
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * UNIT))
    fq.set_tenant_policy("b", TenantPolicy(1, 2 * UNIT))
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 8))
    fq.set_engine_policy(EnginePolicy("e2", "q", 8 * UNIT, 8))
    keys = Keys()

    def enqueue(tenant: str, pool: str, now: float) -> str:
        return fq.enqueue(tenant=tenant, pool=pool, request_class="standard", prompt_tokens=100,
                          max_tokens=50, kv_bytes=UNIT, now=now).job_id  # fmt: skip

    in_p = enqueue("a", "p", now=0)
    assert pick(fq, now=1).job_id == in_p  # a asks once: its whole quota, leased to p
    assert fq.leases.tenant_slot("a").leased == {"p": 2 * UNIT}
    a_in_q, b_in_q = enqueue("a", "q", now=2), enqueue("b", "q", now=3)
    picked = fq.pick("q", "e2", now=4)  # a is fairest in q, but its quota is p's
    assert picked is not None
    assert picked.job_id == b_in_q  # passed over; b asked in turn
    assert fq_redis.smembers(keys.lease_starved()) == {"a q"}
    assert fq.pick("q", "e2", now=4) is None  # a asked a moment ago: not again yet
    assert fq.rebalance_leases() == ["q"]  # p gives back the unit its job does not hold
    assert fq.leases.tenant_slot("a").leased == {"p": UNIT}
    moved = fq.pick("q", "e2", now=4)
    assert moved is not None
    assert moved.job_id == a_in_q
    assert fq.leases.tenant_slot("a").leased == {"p": UNIT, "q": UNIT}
    assert fq.snapshot().tenant_reserved_bytes == {"a": 2 * UNIT, "b": UNIT}
    assert fq.check().ok

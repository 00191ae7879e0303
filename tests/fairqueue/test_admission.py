"""Memory admission in the pick, and rejection at enqueue of what can never run."""

from dataclasses import replace

import pytest

from fairqueue import EnginePolicy, FairQueue, Job, JobRejected, TenantPolicy

UNIT = 256 * 1024 * 1024


def submit(fq: FairQueue, tenant: str, kv_units: float, request_class: str = "standard") -> Job:
    return fq.enqueue(
        tenant=tenant,
        pool="p",
        request_class=request_class,
        prompt_tokens=10,
        max_tokens=10,
        kv_bytes=int(kv_units * UNIT),
        now=0,
    )


def engine(
    kv_units: int = 8, max_num_seqs: int = 16, load: float = 0.0, queued: int = 0
) -> EnginePolicy:
    return EnginePolicy("e1", "p", kv_units * UNIT, max_num_seqs, 0.4, load, queued)


def test_it_admits_only_what_fits_the_engines_free_kv_budget(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(engine(kv_units=8))
    first, second = submit(fq, "a", 5), submit(fq, "a", 4)
    assert fq.pick("p", "e1", now=1) == fq.get_job(first.pool, first.job_id)
    assert fq.pick("p", "e1", now=1) is None
    fq.release(first.pool, first.job_id, 10, 10, now=2)
    picked = fq.pick("p", "e1", now=3)
    assert picked is not None
    assert picked.job_id == second.job_id


def test_a_small_job_behind_a_big_one_of_another_tenant_still_runs(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_tenant_policy("b", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(engine(kv_units=8))
    submit(fq, "a", 6)
    assert fq.pick("p", "e1", now=1) is not None
    big, small = submit(fq, "a", 6), submit(fq, "b", 1)
    picked = fq.pick("p", "e1", now=2)
    assert picked is not None
    assert picked.job_id == small.job_id
    assert fq.get_job(big.pool, big.job_id).state == "queued"  # type: ignore[union-attr]


def test_it_keeps_a_tenant_within_its_quota(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * UNIT))
    fq.set_engine_policy(engine(kv_units=8))
    jobs = [submit(fq, "a", 1) for _ in range(3)]
    assert fq.pick("p", "e1", now=1) is not None
    assert fq.pick("p", "e1", now=1) is not None
    assert fq.pick("p", "e1", now=1) is None
    assert fq.get_job(jobs[2].pool, jobs[2].job_id).state == "queued"  # type: ignore[union-attr]


def test_burst_is_lent_only_while_no_one_else_waits_within_quota(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 1 * UNIT, burst_bytes=2 * UNIT))
    fq.set_tenant_policy("b", TenantPolicy(1, 1 * UNIT))
    fq.set_engine_policy(engine(kv_units=8))
    a_jobs = [submit(fq, "a", 1) for _ in range(4)]
    # Alone, a borrows up to quota + burst = 3 units.
    assert [fq.pick("p", "e1", now=1) is not None for _ in range(4)] == [True, True, True, False]
    fq.release(a_jobs[0].pool, a_jobs[0].job_id, 10, 10, now=2)
    fq.release(a_jobs[1].pool, a_jobs[1].job_id, 10, 10, now=2)
    # a holds 1 unit (its quota). b now waits within its quota: no idle capacity to lend,
    # so b goes first although a's next job is older.
    b_job = submit(fq, "b", 1)
    picked = fq.pick("p", "e1", now=3)
    assert picked is not None
    assert picked.job_id == b_job.job_id
    # b's queue is empty again: a may borrow once more.
    picked = fq.pick("p", "e1", now=3)
    assert picked is not None
    assert picked.job_id == a_jobs[3].job_id


def test_burst_is_not_lent_while_another_tenant_waits_within_quota(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 1 * UNIT, burst_bytes=4 * UNIT))
    fq.set_tenant_policy("b", TenantPolicy(1, 1 * UNIT))
    fq.set_engine_policy(engine(kv_units=8))
    submit(fq, "a", 1)
    submit(fq, "a", 1)
    submit(fq, "b", 1)
    submit(fq, "b", 1)
    picked = [fq.pick("p", "e1", now=1) for _ in range(4)]
    tenants = [job.tenant if job else None for job in picked]
    # Each gets its quota; then b waits over quota (it has no burst), so the engine is idle
    # for a's purposes and a borrows.
    assert sorted(t for t in tenants[:2] if t) == ["a", "b"]
    assert tenants[2:] == ["a", None]


def test_it_never_runs_more_than_max_num_seqs(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(engine(kv_units=80, max_num_seqs=3))
    for _ in range(5):
        submit(fq, "a", 1)
    picked = [fq.pick("p", "e1", now=1) for _ in range(5)]
    assert sum(job is not None for job in picked) == 3


@pytest.mark.parametrize(
    ("kv_units", "seats", "queued", "admitted"),
    [
        (80, 3, 2, 5),  # its seats and its own queue, and no more
        (4, 2, 8, 4),  # a queued request's KV is reserved like a running one's: the budget binds
    ],
)
def test_an_engine_holds_its_seats_and_its_queue_within_its_kv_budget(
    fq: FairQueue, kv_units: int, seats: int, queued: int, admitted: int
) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(engine(kv_units=kv_units, max_num_seqs=seats, queued=queued))
    for _ in range(8):
        submit(fq, "a", 1)
    picked = [fq.pick("p", "e1", now=1) for _ in range(8)]
    assert sum(job is not None for job in picked) == admitted


def test_offline_waits_while_load_is_at_the_threshold(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(engine(load=0.4))
    job = submit(fq, "a", 1, request_class="offline")
    assert fq.pick("p", "e1", now=1) is None
    fq.set_engine_load("p", "e1", 0.39)
    picked = fq.pick("p", "e1", now=2)
    assert picked is not None
    assert picked.job_id == job.job_id


def test_the_load_reopens_the_gate_only_below_the_threshold_less_the_margin(
    fq: FairQueue,
) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(replace(engine(), offline_gate_margin=0.1))
    submit(fq, "a", 1, request_class="offline")
    assert fq.set_engine_load("p", "e1", 0.45, "tensor_activity")  # closed at the threshold
    assert fq.set_engine_load("p", "e1", 0.35, "tensor_activity")  # still closed: over 0.3
    assert fq.pick("p", "e1", now=1) is None
    assert not fq.set_engine_load("p", "e1", 0.25, "kv_cache_usage")
    assert fq.pick("p", "e1", now=2) is not None
    policy = fq.redis.hmget(fq.keys.engine("p", "e1"), ["load_signal", "load_closed"])
    assert [str(v, "utf-8") if isinstance(v, bytes) else v for v in policy] == [
        "kv_cache_usage",
        "0",
    ]


def test_online_seats_shut_offline_out_at_the_next_pick(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(engine(max_num_seqs=10))
    online = [submit(fq, "a", 0.1, request_class="interactive") for _ in range(4)]
    assert all(fq.pick("p", "e1", now=1) is not None for _ in online)
    offline = submit(fq, "a", 0.1, request_class="offline")
    assert fq.pick("p", "e1", now=1) is None  # 4 of 10 seats online: 0.4
    fq.release(online[0].pool, online[0].job_id, 10, 10, now=2)
    picked = fq.pick("p", "e1", now=3)  # no sampler tick in between
    assert picked is not None
    assert picked.job_id == offline.job_id


def test_offline_takes_the_free_seats_but_the_reserve(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(replace(engine(max_num_seqs=8, queued=8), offline_reserve=2))
    for _ in range(10):
        submit(fq, "a", 0.1, request_class="offline")
    picked = [fq.pick("p", "e1", now=1) for _ in range(10)]
    assert sum(job is not None for job in picked) == 6
    assert fq.snapshot().engine_offline["e1"] == 6
    interactive = submit(fq, "a", 0.1, request_class="interactive")
    got = fq.pick("p", "e1", now=2)  # the reserve is there for it
    assert got is not None
    assert got.job_id == interactive.job_id
    assert fq.check().ok


@pytest.mark.parametrize(
    ("kv_units", "tenant", "reason"),
    [
        (9, "a", "larger_than_engine"),
        (5, "a", "larger_than_quota"),
        (1, "nobody", "unknown_tenant"),
    ],
)
def test_it_rejects_at_enqueue_what_can_never_run(
    fq: FairQueue, kv_units: int, tenant: str, reason: str
) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * UNIT, burst_bytes=2 * UNIT))
    fq.set_engine_policy(engine(kv_units=8))
    with pytest.raises(JobRejected) as caught:
        submit(fq, tenant, kv_units)
    assert caught.value.reason == reason
    assert caught.value.message
    assert fq.snapshot().queues == []


def test_it_rejects_a_pool_without_engines_an_unknown_class_and_a_duplicate(
    fq: FairQueue,
) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * UNIT))
    with pytest.raises(JobRejected, match="no engine") as caught:
        submit(fq, "a", 1)
    assert caught.value.reason == "no_engine"
    fq.set_engine_policy(engine())
    with pytest.raises(JobRejected) as caught:
        submit(fq, "a", 1, request_class="urgent")
    assert caught.value.reason == "unknown_class"
    job = submit(fq, "a", 1)
    with pytest.raises(JobRejected) as caught:
        fq.enqueue(
            tenant="a",
            pool="p",
            request_class="standard",
            prompt_tokens=1,
            max_tokens=1,
            kv_bytes=1,
            job_id=job.job_id,
        )
    assert caught.value.reason == "duplicate_job"


def test_an_engine_of_another_pool_cannot_pick_here(fq: FairQueue) -> None:
    fq.set_engine_policy(EnginePolicy("e2", "other", UNIT, 4))
    with pytest.raises(Exception, match="e2 does not serve pool p"):
        fq.pick("p", "e2", now=1)


def test_a_tenant_may_have_only_so_many_jobs_waiting_and_others_are_not_held_back(
    fq: FairQueue,
) -> None:
    for tenant in ("a", "b"):
        fq.set_tenant_policy(tenant, TenantPolicy(1, 100 * UNIT))
    fq.set_engine_policy(engine(kv_units=8))

    def waiting(tenant: str, request_class: str = "standard") -> Job:
        return fq.enqueue_summoning(
            tenant=tenant, pool="p", request_class=request_class, prompt_tokens=10,
            max_tokens=10, kv_bytes=UNIT, max_waiting=3,
        )[0]  # fmt: skip

    waiting("a"), waiting("a", "interactive"), waiting("a", "offline")  # every class counts
    with pytest.raises(JobRejected) as refused:
        waiting("a")
    assert refused.value.reason == "too_many_waiting"
    assert waiting("b").tenant == "b"  # another tenant's jobs are its own count
    assert fq.pick("p", "e1") is not None  # one of a's leaves the queue for the engine
    assert waiting("a").tenant == "a"
    assert submit(fq, "a", 1).tenant == "a"  # work queued without a limit (batch lines)

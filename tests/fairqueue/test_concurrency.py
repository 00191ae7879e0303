"""Many workers picking, releasing, cancelling and requeueing at once, with a reaper on
short leases: reservations never pass a budget or quota + burst, never go negative, and
the (atomic) invariant check never sees drift, during the run or after it."""

import random
import threading
import time

import redis

from fairqueue import EnginePolicy, FairQueue, FairQueueConfig, TenantPolicy

UNIT = 256 * 1024 * 1024
TENANTS = {"a": TenantPolicy(1, 2 * UNIT, UNIT), "b": TenantPolicy(2, 2 * UNIT, UNIT),
           "c": TenantPolicy(3, 3 * UNIT)}  # fmt: skip
ENGINES = [EnginePolicy(f"e{i}", "p", 4 * UNIT, 3, 0.4, 0.2) for i in (1, 2)]
JOBS = 240


def work(fq: FairQueue, engine_id: str, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        job = fq.pick("p", engine_id)
        if job is None:
            time.sleep(0.001)
            continue
        # Up to twice the lease: about half the runs outlive theirs, so the reaper takes jobs
        # from under their workers whatever the speed of Redis calls.
        time.sleep(rng.random() * 0.008)
        roll = rng.random()
        if roll < 0.8:
            fq.release(job.pool, job.job_id, job.prompt_tokens, rng.randint(0, job.max_tokens),
                       attempt=job.attempt)  # fmt: skip
        elif roll < 0.9:
            fq.cancel(job.pool, job.job_id, reason="client_disconnected")
        else:
            fq.requeue(job.pool, job.job_id, attempt=job.attempt)


def reap(fq: FairQueue, stop: threading.Event, reaped: list[str]) -> None:
    while not stop.is_set():
        reaped.extend(fq.reap_expired_leases())
        time.sleep(0.002)


def watch(fq: FairQueue, stop: threading.Event, seen: list[str]) -> None:
    budget = {e.engine_id: e.kv_budget_bytes for e in ENGINES}
    while not stop.is_set():
        report = fq.check()
        seen.extend(report.problems)
        for tenant, (recorded, _) in report.tenant_reserved.items():
            policy = TENANTS[tenant]
            if not 0 <= recorded <= policy.quota_bytes + policy.burst_bytes:
                seen.append(f"tenant {tenant} holds {recorded}")
        for engine_id, (recorded, _, jobs, _) in report.engine_reserved.items():
            if not 0 <= recorded <= budget[engine_id] or not 0 <= jobs <= 3:
                seen.append(f"engine {engine_id} holds {recorded} in {jobs} jobs")
        time.sleep(0.001)


def test_concurrent_workers_never_overcommit_and_leave_no_drift(fq_redis: redis.Redis) -> None:
    fq = FairQueue(fq_redis, FairQueueConfig(lease_s=0.004))  # short: the reaper gets busy
    for name, policy in TENANTS.items():
        fq.set_tenant_policy(name, policy)
    for engine in ENGINES:
        fq.set_engine_policy(engine)
    rng = random.Random(1)
    job_ids = [
        fq.enqueue(
            tenant=rng.choice(list(TENANTS)),
            pool="p",
            request_class=rng.choice(["interactive", "standard", "offline"]),
            prompt_tokens=rng.randint(1, 100),
            max_tokens=rng.randint(1, 100),
            kv_bytes=rng.randint(UNIT // 4, 3 * UNIT // 2),
        ).job_id
        for _ in range(JOBS)
    ]
    stop = threading.Event()
    problems: list[str] = []
    reaped: list[str] = []
    threads = [
        threading.Thread(target=work, args=(fq, engine.engine_id, seed, stop))
        for seed, engine in enumerate(ENGINES * 3)
    ]
    threads += [threading.Thread(target=reap, args=(fq, stop, reaped)),
                threading.Thread(target=watch, args=(fq, stop, problems))]  # fmt: skip
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            states = {fq_redis.hget(fq.keys.job("p", job_id), "state") for job_id in job_ids}
            if states <= {"done", "cancelled"}:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert problems == []
    assert reaped  # leases did expire under the workers' feet
    assert states <= {"done", "cancelled"}
    report = fq.check()
    assert report.ok
    assert all(recorded == 0 for recorded, _ in report.tenant_reserved.values())
    assert all(values == (0, 0, 0, 0) for values in report.engine_reserved.values())

"""The Lua scripts against the pure model: random sequences of enqueue, pick (for an engine
or for the pool's roomiest engine), release (alone or with the next pick in one step),
cancel, requeue and load changes on the real Redis make the same decisions as the model,
step by step, and the invariant check finds no drift after any of them."""

import redis
from hypothesis import HealthCheck, given, settings

from fairqueue import FairQueue, Job, JobRejected
from fairqueue.model import FairModel, ModelJob
from tests.fairqueue.test_model import (
    ENGINES,
    TENANTS,
    WEIGHTS,
    operations,
    random_job,
)


def fresh(client: redis.Redis) -> tuple[FairQueue, FairModel]:
    client.flushdb()
    fq = FairQueue(client)
    for name, policy in TENANTS.items():
        fq.set_tenant_policy(name, policy)
    for engine in ENGINES.values():
        fq.set_engine_policy(engine)
    return fq, FairModel(WEIGHTS, TENANTS, ENGINES)


def enqueue_both(fq: FairQueue, model: FairModel, job: ModelJob) -> None:
    try:
        model.enqueue(job)
        expected = ""
    except JobRejected as rejected:
        expected = rejected.reason
    try:
        fq.enqueue(
            tenant=job.tenant, pool="p", request_class=job.request_class,
            prompt_tokens=job.prompt_tokens, max_tokens=job.max_tokens, kv_bytes=job.kv_bytes,
            job_id=job.job_id, now=0, seqs=job.seqs, affinity=job.affinity,
        )  # fmt: skip
        got = ""
    except JobRejected as rejected:
        got = rejected.reason
    assert got == expected


def same_job(got: Job | None, expected: ModelJob | None) -> bool:
    if got is None or expected is None:
        return got is None and expected is None
    picked = (expected.job_id, expected.engine_id, "running", expected.stamp)
    return (got.job_id, got.engine_id, got.state, got.stamp) == picked


def step(fq: FairQueue, model: FairModel, op: tuple[str, int, int, int, int], serial: int) -> None:
    kind, x, y, z, w = op
    running = sorted(j.job_id for j in model.jobs.values() if j.state == "running")
    live = sorted(j.job_id for j in model.jobs.values() if j.state in ("running", "queued"))
    engine_id = "e1" if x % 2 == 0 else "e2"
    if kind == "enqueue":
        job = random_job(op, serial)
        enqueue_both(fq, model, job)
    elif kind == "pick":
        if y % 3 == 2:
            expected, got = model.pick_in_pool(), fq.pick("p", now=1)
        else:
            expected, got = model.pick(engine_id), fq.pick("p", engine_id, now=1)
        assert same_job(got, expected)
    elif kind == "release" and running and w % 2:
        ran = fq.get_job(running[x % len(running)])
        assert ran is not None
        released, got = fq.release_and_pick(ran, 1 + y, z, pool="p", now=2)
        assert released == model.release(ran.job_id, 1 + y, z)
        assert same_job(got, model.pick_in_pool())
    elif kind == "release" and running:
        job_id = running[x % len(running)]
        assert fq.release(job_id, 1 + y, z, now=2) == model.release(job_id, 1 + y, z)
    elif kind == "cancel" and live:
        job_id = live[x % len(live)]
        assert fq.cancel(job_id, now=2) == model.cancel(job_id)
    elif kind == "requeue" and running:
        job_id = running[x % len(running)]
        assert fq.requeue(job_id, now=2) == model.requeue(job_id)
    elif kind == "load":
        assert fq.set_engine_load(engine_id, y / 8) == model.set_load(engine_id, y / 8)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=operations)
def test_the_scripts_decide_as_the_model_does(
    fq_redis: redis.Redis, ops: list[tuple[str, int, int, int, int]]
) -> None:
    fq, model = fresh(fq_redis)
    for serial, op in enumerate(ops):
        step(fq, model, op, serial)
        assert fq.check().ok
    counters = {(row.request_class, row.tenant): row.counter for row in fq.snapshot(now=3).queues}
    assert counters == model.counters
    snap = fq.snapshot()
    assert snap.tenant_reserved_bytes == model.tenant_reserved
    assert snap.engine_reserved_bytes == model.engine_reserved

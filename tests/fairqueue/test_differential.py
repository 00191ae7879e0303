"""The Lua scripts against the pure model: random sequences of enqueue, pick (for an engine
or for the pool's roomiest engine), release (alone or with the next pick in one step),
cancel, requeue and load changes on the real Redis make the same decisions as the model,
step by step, and the invariant check finds no drift after any of them. Two pools: the
model tests' (every class, tight quotas, load changes) and a busy one (every seat taken most
of the time, tenants backlogged side by side, affinity keys shared by a cache group), where
picks give a freed seat to a job whose prefix the engine holds (`lua/lib.lua`
AFFINITY_SCAN)."""

from collections.abc import Callable, Mapping

import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fairqueue import EnginePolicy, FairQueue, Job, JobRejected, TenantPolicy
from fairqueue.model import FairModel, ModelJob
from tests.fairqueue.test_model import (
    ENGINES,
    TENANTS,
    WEIGHTS,
    operations,
    random_job,
)

Op = tuple[str, int, int, int, int]

# The busy pool: two engines of few seats, five tenants with room in their quotas for
# several jobs each (and a burst), d and e in one cache group.
BUSY_TENANTS = {
    "a": TenantPolicy(1, 8, 2),
    "b": TenantPolicy(1, 8, 2),
    "c": TenantPolicy(2, 8, 2),
    "d": TenantPolicy(1, 6, 0),
    "e": TenantPolicy(3, 8, 2),
}
BUSY_ENGINES = {
    "e1": EnginePolicy("e1", "p", 12, 2),
    "e2": EnginePolicy("e2", "p", 12, 2, queued=1),
}
BUSY_KINDS = ["enqueue"] * 4 + ["pick"] * 2 + ["release"] * 3 + ["cancel"]
busy_operations = st.lists(
    st.tuples(st.sampled_from(BUSY_KINDS), *[st.integers(0, 8)] * 4),
    min_size=40,
    max_size=120,
)

# A busy-pool sequence in which a pick gives the seat to a job whose prefix the engine
# holds, in place of the fairest job, whose prefix is on the other engine, which cannot run
# it now (`lua/lib.lua` AFFINITY_SCAN).
PREFIX_HERE_OPS: list[Op] = [
    ("enqueue", 0, 2, 1, 5), ("pick", 2, 6, 2, 1), ("enqueue", 7, 2, 2, 0),
    ("enqueue", 3, 3, 2, 2), ("pick", 5, 3, 8, 3), ("enqueue", 3, 6, 4, 0),
    ("pick", 6, 2, 2, 4), ("enqueue", 5, 4, 0, 5), ("pick", 8, 5, 8, 4),
]  # fmt: skip


def busy_job(op: Op, serial: int) -> ModelJob:
    """An `enqueue` of the busy pool: standard but one in nine, with its tenant's key (d and
    e share their group's), one in seven with none."""
    _, x, y, z, w = op
    tenant = "abcde"[x % 5]
    request_class = "interactive" if y == 0 else "standard"
    affinity = "" if (y + z) % 7 == 0 else ("k-de" if tenant in "de" else f"k-{tenant}")
    return ModelJob(
        f"j{serial}", tenant, request_class, 1 + z, 1 + w, 1 + (x + z) % 3, affinity=affinity
    )


def fresh(
    client: redis.Redis,
    tenants: Mapping[str, TenantPolicy] = TENANTS,
    engines: Mapping[str, EnginePolicy] = ENGINES,
) -> tuple[FairQueue, FairModel]:
    client.flushdb()
    fq = FairQueue(client)
    for name, policy in tenants.items():
        fq.set_tenant_policy(name, policy)
    for engine in engines.values():
        fq.set_engine_policy(engine)
    return fq, FairModel(WEIGHTS, tenants, engines)


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


def step(
    fq: FairQueue,
    model: FairModel,
    op: Op,
    serial: int,
    make_job: Callable[[Op, int], ModelJob] = random_job,
) -> None:
    kind, x, y, z, w = op
    running = sorted(j.job_id for j in model.jobs.values() if j.state == "running")
    live = sorted(j.job_id for j in model.jobs.values() if j.state in ("running", "queued"))
    engine_id = "e1" if x % 2 == 0 else "e2"
    if kind == "enqueue":
        job = make_job(op, serial)
        enqueue_both(fq, model, job)
    elif kind == "pick":
        if y % 3 == 2:
            expected, got = model.pick_in_pool(), fq.pick("p", now=1)
        else:
            expected, got = model.pick(engine_id), fq.pick("p", engine_id, now=1)
        assert same_job(got, expected)
    elif kind == "release" and running and w % 2:
        ran = fq.get_job("p", running[x % len(running)])
        assert ran is not None
        released, got = fq.release_and_pick(ran, 1 + y, z, pool="p", now=2)
        assert released == model.release(ran.job_id, 1 + y, z)
        assert same_job(got, model.pick_in_pool())
    elif kind == "release" and running:
        job_id = running[x % len(running)]
        assert fq.release("p", job_id, 1 + y, z, now=2) == model.release(job_id, 1 + y, z)
    elif kind == "cancel" and live:
        job_id = live[x % len(live)]
        assert fq.cancel("p", job_id, now=2) == model.cancel(job_id)
    elif kind == "requeue" and running:
        job_id = running[x % len(running)]
        assert fq.requeue("p", job_id, now=2) == model.requeue(job_id)
    elif kind == "load":
        assert fq.set_engine_load("p", engine_id, y / 8) == model.set_load(engine_id, y / 8)


def run_both(
    fq: FairQueue,
    model: FairModel,
    ops: list[Op],
    make_job: Callable[[Op, int], ModelJob] = random_job,
) -> None:
    for serial, op in enumerate(ops):
        step(fq, model, op, serial, make_job)
        assert fq.check().ok
    counters = {(row.request_class, row.tenant): row.counter for row in fq.snapshot(now=3).queues}
    assert counters == model.counters
    snap = fq.snapshot()
    assert snap.tenant_reserved_bytes == model.tenant_reserved
    assert snap.engine_reserved_bytes == model.engine_reserved


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=operations)
def test_the_scripts_decide_as_the_model_does(fq_redis: redis.Redis, ops: list[Op]) -> None:
    fq, model = fresh(fq_redis)
    run_both(fq, model, ops)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=busy_operations)
@example(ops=PREFIX_HERE_OPS)
def test_the_scripts_decide_as_the_model_does_with_every_seat_busy(
    fq_redis: redis.Redis, ops: list[Op]
) -> None:
    fq, model = fresh(fq_redis, BUSY_TENANTS, BUSY_ENGINES)
    run_both(fq, model, ops, busy_job)

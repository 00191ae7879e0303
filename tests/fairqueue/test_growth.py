"""A running job's reservation growing as its stream's pieces are counted
(`fairqueue.growth.Growth`), on the real scripts and Redis."""

from __future__ import annotations

import asyncio

from fairqueue import EnginePolicy, FairQueue, TenantPolicy
from fairqueue.aio import AsyncFairQueue
from fairqueue.growth import Growth
from plumbing.aio_redis import AsyncRedis
from tests.fairqueue.conftest import FAIRQUEUE_REDIS_URL

TOKEN, FLOOR, MAX_TOKENS = 1000, 100_000, 1000


def test_counted_pieces_grow_the_reservation_a_few_times_at_most(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 10**12))
    fq.set_engine_policy(EnginePolicy("e1", "p", 10**9, 64, reservation="predict"))

    def submit() -> None:
        fq.enqueue(
            tenant="a", pool="p", request_class="standard", prompt_tokens=90,
            max_tokens=MAX_TOKENS, kv_bytes=FLOOR + MAX_TOKENS * TOKEN, kv_floor=FLOOR,
            kv_token=TOKEN, observed=True,
        )  # fmt: skip

    for _ in range(8):
        submit()
        done = fq.pick("p", "e1")
        assert done is not None
        fq.release(done.pool, done.job_id, 90, 10)
    submit()
    job = fq.pick("p", "e1")
    assert job is not None
    assert job.covered_tokens == 10

    grows: list[int] = []

    async def stream() -> None:
        client = AsyncRedis(FAIRQUEUE_REDIS_URL, max_connections=4, read_timeout_s=5)
        queue = AsyncFairQueue(fq, client)
        calls = queue.grow

        async def counted(pool: str, job_id: str, attempt: int, tokens: int) -> int:
            grows.append(tokens)
            return await calls(pool, job_id, attempt, tokens)

        queue.grow = counted  # type: ignore[method-assign]
        growth = Growth(queue, job.pool, job.job_id, job.attempt, job.covered_tokens)
        try:
            for _ in range(200):  # one piece at a time, as a stream's chunks come
                growth.add(1)
                await asyncio.sleep(0.001)
            while growth._growing is not None:
                await asyncio.sleep(0.001)
            growth.close()
            growth.add(1000)  # over: nothing grows any more
            assert growth._growing is None
        finally:
            client.close()

    asyncio.run(stream())
    # Each grow covers twice the tokens so far: 11 -> 22 -> 44 -> ..., a few calls in all.
    assert 3 <= len(grows) <= 6
    reserved = int(fq.redis.hget(fq.keys.engine_usage("p", "e1"), "reserved") or 0)
    assert FLOOR + 200 * TOKEN <= reserved <= FLOOR + 400 * TOKEN
    assert fq.check().ok

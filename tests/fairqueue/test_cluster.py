"""The fair queue on a real Redis Cluster of three primaries: each call of a pool is routed
to the primary of the pool's slot (`{p:<pool>}`, its one declared key) and touches that slot
alone. A tenant's quota spans the pools through its leases (`fairqueue/leases.py`): a pick
admits against the tenant's lease in the pool's slot, and asks the tenant's own slot for
more between two calls; the quota holds across the pools, on the threads' client
(redis-py's) and on the event loops' (plumbing/aio_redis_cluster.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster as PyRedisCluster
from redis.crc import key_slot

from fairqueue import EnginePolicy, FairQueue, TenantPolicy
from fairqueue.aio import AsyncFairQueue
from fairqueue.domain import DispatchLoop
from fairqueue.keys import Keys
from plumbing.aio_redis_cluster import AsyncRedisCluster
from tests.support.redis_cluster import RedisCluster

UNIT = 256 * 1024 * 1024
POOLS = ("p", "q", "r", "s")


@pytest.fixture
def cluster_fq(cluster: RedisCluster) -> Iterator[FairQueue]:
    client = PyRedisCluster.from_url(cluster.url, decode_responses=True)
    client.flushall()  # every primary
    client.function_flush()
    fq = FairQueue(client)  # type: ignore[arg-type]  # a cluster client takes the same calls
    fq.load_library()  # on every primary
    yield fq
    client.close()


def submit(fq: FairQueue, pool: str, tenant: str, now: float | None) -> str:
    return fq.enqueue(
        tenant=tenant, pool=pool, request_class="interactive", prompt_tokens=10,
        max_tokens=10, kv_bytes=UNIT, now=now,
    ).job_id  # fmt: skip


def test_the_pools_calls_run_each_on_its_pools_primary(cluster_fq: FairQueue) -> None:
    fq, keys = cluster_fq, Keys()
    client = fq.redis
    assert isinstance(client, PyRedisCluster)
    for tenant in "ab":
        fq.set_tenant_policy(tenant, TenantPolicy(1, 4 * UNIT))
    for pool in POOLS:
        fq.set_engine_policy(EnginePolicy(f"e-{pool}", pool, 8 * UNIT, 8))
    assert len({client.get_node_from_key(keys.pool_tag(p)).port for p in POOLS}) > 1
    for pool in POOLS:
        expired = submit(fq, pool, "a", now=0)
        cancelled, waiting = submit(fq, pool, "b", now=20), submit(fq, pool, "a", now=20)
        assert fq.expire_waiting(now=35, pool=pool) == [expired]
        assert fq.cancel(pool, cancelled, now=36) == "queued"
        loop = DispatchLoop(token=f"loop-{pool}")
        fq.wait_for_work(pool, loop, timeout_s=0.01)
        assert not fq.stop_waiting(pool, loop)
        assert fq.kick(pool)  # no loop waits: one must be summoned
        assert not fq.set_engine_load(pool, f"e-{pool}", 0.1)
        fq.publish(pool, waiting, {"event": "note"})
        assert fq.events(pool, waiting) == [{"event": "note"}]
        assert fq.pools_with_waiting_work() == sorted(POOLS[: POOLS.index(pool) + 1])
        # The pool's keys are in its slot (the tenants' policies are copied into it).
        slot = key_slot(keys.pool_tag(pool).encode())
        for key in (keys.job(pool, waiting), keys.tenant(pool, "a"), keys.waiting(pool)):
            assert key_slot(key.encode()) == slot
            assert client.exists(key)
    assert {row.pool for row in fq.snapshot(now=40).queues} == set(POOLS)


def test_a_tenants_jobs_run_in_every_pool_within_its_one_quota(cluster_fq: FairQueue) -> None:
    """Pick, grow, release, cancel, requeue and reap in pools on different primaries; the
    tenant's quota (two jobs' worth) is leased to the pool that asks, and comes back to
    another pool that asks through housekeeping's rebalance."""
    fq, keys = cluster_fq, Keys()
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * UNIT))
    for pool in ("p", "q"):
        fq.set_engine_policy(EnginePolicy(f"e-{pool}", pool, 8 * UNIT, 8))
    assert fq.redis.get_node_from_key(keys.pool_tag("p")).port != (  # type: ignore[attr-defined]
        fq.redis.get_node_from_key(keys.pool_tag("q")).port  # type: ignore[attr-defined]
    )
    first, second = submit(fq, "p", "a", now=0), submit(fq, "p", "a", now=0)
    picked = [fq.pick("p", "e-p", now=1) for _ in range(2)]
    assert [job.job_id for job in picked if job] == [first, second]
    assert fq.leases.tenant_slot("a").leased == {"p": 2 * UNIT}  # the whole quota, asked once
    assert fq.grow("p", first, 1, 5, now=1) == -1  # its worst case: nothing to grow
    waiting = submit(fq, "q", "a", now=1)
    assert fq.pick("q", "e-q", now=2) is None  # the quota is p's, and p's jobs hold it
    assert fq.rebalance_leases() == ["q"]  # nothing unused to bring back yet
    assert fq.pick("q", "e-q", now=2) is None
    # One of p's jobs ends: its share is p's lease, unused, until q asks again.
    assert fq.release("p", first, 10, 10, attempt=1, now=3)
    assert fq.pick("q", "e-q", now=3) is None  # q asked a moment ago: it waits its turn
    assert fq.rebalance_leases() == ["q"]
    assert fq.tenant_held_bytes(["a"]) == {"a": UNIT}
    moved = fq.pick("q", "e-q", now=3)
    assert moved is not None
    assert moved.job_id == waiting
    assert fq.leases.tenant_slot("a").leased == {"p": UNIT, "q": UNIT}
    assert fq.tenant_held_bytes(["a"]) == {"a": 2 * UNIT}
    # What frees a running job gives its share back to its pool's lease.
    assert fq.cancel("q", waiting, now=4) == "running"
    assert fq.requeue("p", second, attempt=1, now=4)
    again = fq.pick("p", "e-p", now=5)
    assert again is not None
    assert again.job_id == second
    assert fq.reap_expired_leases(now=5 + fq.config.lease_s + 1, pool="p") == [second]
    assert fq.tenant_held_bytes(["a"]) == {"a": 0}
    report = fq.check()
    assert report.ok, report.problems
    assert report.tenant_reserved == {"a": (0, 0)}


def test_the_event_loops_client_picks_and_releases_on_the_cluster(
    cluster: RedisCluster, cluster_fq: FairQueue
) -> None:
    """The worker's calls (pick, release_and_pick) from an event loop, through the
    hand-written cluster client: the lease is asked for in the tenant's slot and the pick
    made again in the pool's, each routed to its own primary."""
    fq = cluster_fq
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * UNIT))
    fq.set_engine_policy(EnginePolicy("e-p", "p", 8 * UNIT, 8))
    jobs = [submit(fq, "p", "a", now=None) for _ in range(3)]  # Redis's clock, as the worker's

    async def work() -> list[str]:
        client = AsyncRedisCluster(cluster.url, max_connections=4, read_timeout_s=5)
        queue = AsyncFairQueue(fq, client)  # type: ignore[arg-type]
        try:
            ran: list[str] = []
            first = await queue.pick("p")
            second = await queue.pick("p")
            assert first is not None
            assert second is not None
            assert await queue.pick("p") is None  # the quota holds two
            ran += [first.job_id, second.job_id]
            released, following = await queue.release_and_pick(first, 10, 5, pool="p")
            assert released
            assert following is not None
            ran.append(following.job_id)
            for job in (second, following):
                assert await queue.release(job, 10, 5)
            return ran
        finally:
            client.close()

    assert asyncio.run(work()) == jobs
    assert fq.tenant_held_bytes(["a"]) == {"a": 0}
    assert fq.check().ok


def test_a_dispatchers_batches_span_pools_on_different_primaries(
    cluster: RedisCluster, cluster_fq: FairQueue
) -> None:
    """The calls a dispatcher makes for all its runs at once (renew_leases,
    jobs_still_running, publish_many), for runs of two pools whose slots are on different
    primaries: each pool's part goes to its own primary, the answers in the callers' order."""
    fq, keys = cluster_fq, Keys()
    tenants = {"p": "a", "q": "b"}  # a tenant's quota is leased to the pool it runs in
    for pool, tenant in tenants.items():
        fq.set_tenant_policy(tenant, TenantPolicy(1, 4 * UNIT))
        fq.set_engine_policy(EnginePolicy(f"e-{pool}", pool, 8 * UNIT, 8))
    client = fq.redis
    assert isinstance(client, PyRedisCluster)
    assert client.get_node_from_key(keys.pool_tag("p")) != client.get_node_from_key(
        keys.pool_tag("q")
    )
    for pool in ("p", "q", "p"):
        submit(fq, pool, tenants[pool], now=None)
    jobs = [fq.pick(pool, f"e-{pool}") for pool in ("p", "q", "p")]
    running = [job for job in jobs if job is not None]
    assert [job.pool for job in running] == ["p", "q", "p"]
    # The first job's run ended (another attempt of it, as the reaper's): not ours any more.
    assert fq.requeue("p", running[0].job_id, attempt=running[0].attempt)
    inboxes = [keys.inbox("p", "w1"), keys.inbox("q", "w1")]

    async def work() -> tuple[list[bool], list[bool]]:
        aio = AsyncRedisCluster(cluster.url, max_connections=4, read_timeout_s=5)
        queue = AsyncFairQueue(fq, aio)
        try:
            renewed = await queue.renew_leases(running)
            still = await queue.jobs_still_running(running)
            await queue.publish_many(
                [
                    (inboxes[0], b"1 one"),
                    (keys.events("q", running[1].job_id), '{"event":"note","n":1}'),
                    (inboxes[1], b"2 two"),
                    (inboxes[0], b"3 three"),
                    (keys.events("q", running[1].job_id), '{"event":"note","n":2}'),
                ]
            )
            return renewed, still
        finally:
            aio.close()

    assert asyncio.run(work()) == ([False, True, True], [False, True, True])
    assert client.lrange(inboxes[0], 0, -1) == ["1 one", "3 three"]
    assert client.lrange(inboxes[1], 0, -1) == ["2 two"]
    assert fq.events("q", running[1].job_id) == [
        {"event": "note", "n": 1},
        {"event": "note", "n": 2},
    ]
    for key in (*inboxes, keys.events("q", running[1].job_id)):
        assert 0 < client.ttl(key) <= fq.config.keep_s

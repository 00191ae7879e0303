"""The fair queue on a real Redis Cluster of three primaries: each call of a pool is routed
to the primary of the pool's slot (`{p:<pool>}`, its one declared key) and touches that slot
alone, but for the tenants' quota in use (`tenant:<t>:use`), which the pick, the release and
what frees a running job still share across the pools: until the quota leases
(`fairqueue/leases.py`) replace it there, those calls cannot run on a cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster as PyRedisCluster
from redis.crc import key_slot

from fairqueue import EnginePolicy, FairQueue, TenantPolicy
from fairqueue.domain import DispatchLoop
from fairqueue.keys import Keys
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


def submit(fq: FairQueue, pool: str, tenant: str, now: float) -> str:
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


def test_the_pick_still_reads_the_tenants_quota_in_use_of_another_slot(
    cluster_fq: FairQueue,
) -> None:
    """What remains of the layout: the pick admits a job against `tenant:<t>:use`, shared by
    the pools; on a cluster Redis refuses the call (it ran nothing)."""
    fq = cluster_fq
    fq.set_tenant_policy("a", TenantPolicy(1, 4 * UNIT))
    fq.set_engine_policy(EnginePolicy("e1", "p", 8 * UNIT, 8))
    job_id = submit(fq, "p", "a", now=0)
    tenant_slot = key_slot(Keys().tenant_usage("a").encode())
    assert tenant_slot != key_slot(Keys().pool_tag("p").encode())
    with pytest.raises(redis.ResponseError, match=r"non local key|the same slot"):
        fq.pick("p", "e1", now=1)
    assert fq.job_state("p", job_id) == ("queued", 0)

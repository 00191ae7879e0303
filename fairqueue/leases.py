"""`Leases`: a tenant's quota leased to pools, over one Redis or a Redis Cluster.

Each step is one keyed function of the fair queue's library (`lua/lease_*.lua`), called
with the one key it touches: the tenant's slot, `{t:<tenant>}:quota`, or the tenant's lease
in a pool's slot, `{p:<pool>}:lease:<tenant>` (`keys.py`). A cluster client routes the call
to the primary that serves that key's slot; nothing here spans two slots. The rules, what a
crash between two steps leaves and why the quota holds anyway are those of the pure
reference, `leases_model.py`, which `tests/fairqueue/test_leases.py` holds these functions
to step by step, on one Redis and on a cluster.

The client is redis-py's: `redis.Redis`, or `redis.cluster.RedisCluster` (which loads a
library on every primary). The fair queue's pick admits against the lease in the pool's slot
(lua/lib.lua pick_on); `FairQueue` asks for a lease where a pick says one holds a job back
(`grant` and `apply`), gives back what the pools of a starved tenant lease beyond what their
jobs hold (`give_back_unused`), and writes the tenant's quota here with its policy.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

from fairqueue import library
from fairqueue.keys import DEFAULT_PREFIX, Keys, check_id, check_tag
from fairqueue.leases_model import Grant, PoolLease, Standing, TenantSlot


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(flat: Any) -> dict[str, str]:
    """HGETALL's reply (a dict from redis-py) with text keys and values."""
    return {_text(name): _text(value) for name, value in dict(flat).items()}


def tenant_slot_of(reply: Any) -> TenantSlot:
    """A tenant's slot from its hash (HGETALL's reply: a dict, or a flat list from the
    event loops' client)."""
    if isinstance(reply, list | tuple):
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    slot = TenantSlot()
    for name, value in _fields(reply).items():
        kind, _, pool = name.partition(":")
        if kind == "quota":
            slot.quota = int(value)
        elif kind == "burst":
            slot.burst = int(value)
        elif kind == "lease":
            slot.leased[pool] = int(value)
        elif kind == "seq":
            slot.seq[pool] = int(value)
    return slot


class Leases:
    def __init__(self, client: redis.Redis | RedisCluster, prefix: str = DEFAULT_PREFIX) -> None:
        self.redis = client
        self.keys = Keys(prefix)

    def _tenant_key(self, tenant: str) -> str:
        return self.keys.lease_quota(check_tag("tenant", check_id("tenant", tenant)))

    def _pool_key(self, pool: str, tenant: str) -> str:
        return self.keys.lease(check_tag("pool", pool), check_id("tenant", tenant))

    def load_library(self) -> None:
        """Loads the fair queue's library (REPLACE: its name carries its source's hash, so a
        library of that name is this one; on a cluster some primaries may have it already)."""
        self.redis.function_load(library.library_source(), replace=True)

    def _run(self, name: str, key: str, *args: Any) -> Any:
        call = ("FCALL", library.function_name(name), 1, key, *args)
        try:
            return self.redis.execute_command(*call)
        except redis.exceptions.ResponseError as error:
            if not library.is_missing(error):
                raise
        self.load_library()  # Redis ran nothing: it did not know the function
        return self.redis.execute_command(*call)

    # --- the tenant's slot ------------------------------------------------------------------

    def set_policy(self, tenant: str, quota: int, burst: int = 0) -> None:
        if quota < 0 or burst < 0:
            raise ValueError("quota and burst cannot be negative")
        self._run("lease_policy", self._tenant_key(tenant), int(quota), int(burst))

    def grant(self, tenant: str, pool: str, want: int, *, idle: bool = False) -> Grant:
        """Up to `want` bytes of the tenant's quota for `pool` (quota + burst for a pool with
        idle capacity); the pool may use them once the grant is applied (`apply`)."""
        check_tag("pool", pool)
        granted, seq = self._run(
            "lease_grant", self._tenant_key(tenant), pool, int(want), "1" if idle else "0"
        )
        return Grant(tenant, pool, int(granted), int(seq))

    def settle(self, standing: Standing) -> int:
        """A pool's answer (`shrink`, `fence`) told to the tenant's slot; returns the bytes it
        counts leased to that pool now."""
        key = self._tenant_key(standing.tenant)
        pool = check_tag("pool", standing.pool)
        return int(self._run("lease_settle", key, pool, standing.leased, standing.seq))

    def sequences(self, tenant: str) -> dict[str, int]:
        """Each pool ever leased to, with the number of its latest grant."""
        flat = self._run("lease_sequences", self._tenant_key(tenant))
        return {_text(pool): int(seq) for pool, seq in zip(flat[::2], flat[1::2], strict=True)}

    def tenant_slot(self, tenant: str) -> TenantSlot:
        """What the tenant's slot holds, read back."""
        return tenant_slot_of(self.redis.hgetall(self._tenant_key(tenant)))

    # --- a pool's slot ----------------------------------------------------------------------

    def apply(self, grant: Grant) -> bool:
        """The grant reaches its pool; False: it came after a later one or a fence, and is
        lost (the tenant's slot counts it until a settle)."""
        if grant.granted <= 0:
            return False
        key = self._pool_key(grant.pool, grant.tenant)
        return bool(self._run("lease_apply", key, grant.granted, grant.seq))

    def admit(self, pool: str, tenant: str, cost: int) -> bool:
        """A job holding `cost` bytes may run in the pool: held + cost <= leased."""
        if cost < 0:
            raise ValueError("a job's cost cannot be negative")
        return bool(self._run("lease_admit", self._pool_key(pool, tenant), int(cost)))

    def release(self, pool: str, tenant: str, cost: int) -> int:
        """A job holding `cost` bytes ended; returns what the tenant's jobs hold there now."""
        return int(self._run("lease_release", self._pool_key(pool, tenant), int(cost)))

    def shrink(self, pool: str, tenant: str, margin: int = 0) -> Standing:
        """Gives back what the pool's lease holds beyond held + margin; the answer is for
        `settle`."""
        given, leased, seq = self._run("lease_shrink", self._pool_key(pool, tenant), int(margin))
        return Standing(tenant, pool, int(leased), int(seq), int(given))

    def fence(self, pool: str, tenant: str, seq: int) -> Standing:
        """Grants numbered up to `seq` are applied or refused from now on; the answer is for
        `settle`."""
        leased, now = self._run("lease_fence", self._pool_key(pool, tenant), int(seq))
        return Standing(tenant, pool, int(leased), int(now))

    def pool_lease(self, pool: str, tenant: str) -> PoolLease:
        """What the tenant's lease in the pool holds, read back."""
        fields = _fields(self.redis.hgetall(self._pool_key(pool, tenant)))
        return PoolLease(*(int(fields.get(name, 0)) for name in ("leased", "held", "seq")))

    # --- both -------------------------------------------------------------------------------

    def give_back_unused(self, tenant: str) -> dict[str, int]:
        """Every pool leased to gives back what it leases beyond what the tenant's jobs hold
        there, and the tenant's slot counts it back (a shrink, then a reconciliation's fence
        and settle, pool by pool), so a pool that asks next is granted it. Returns the bytes
        counted leased per pool."""
        counted: dict[str, int] = {}
        for pool, seq in sorted(self.sequences(tenant).items()):
            self.shrink(pool, tenant)
            counted[pool] = self.settle(self.fence(pool, tenant, seq))
        return counted

    def reconcile(self, tenant: str) -> dict[str, int]:
        """The tenant's slot counts what its pools lease: one call in its slot, then a fence
        and a settle per pool. A grant still on its way to a pool is refused there (asked
        again, it is granted again). Returns the bytes counted leased per pool."""
        counted: dict[str, int] = {}
        for pool, seq in sorted(self.sequences(tenant).items()):
            counted[pool] = self.settle(self.fence(pool, tenant, seq))
        return counted

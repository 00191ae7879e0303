"""A pure-Python reference of a tenant's quota leased to pools (`lua/lease_*.lua`; docs/
proposals/0001-fair-queue-on-redis-cluster.md, "A tenant's quota across pools: leases").

A tenant's quota is one number and its jobs run in several pools, each in a hash slot of its
own; no call touches two slots. The tenant's slot (`TenantSlot`) holds its quota, its burst
and the bytes it leased to each pool; a pool's slot holds, per tenant, a `PoolLease`: the
bytes leased to it and the bytes its running jobs hold. Every step below touches one slot.

- Growing is two steps: `TenantSlot.grant` (the tenant's slot counts the lease), then
  `PoolLease.apply` (the pool may use it). In between, the tenant's slot counts bytes the
  pool cannot use yet: the quota is under-used, never exceeded.
- Shrinking is two steps: `PoolLease.shrink` (the pool gives back what it leases beyond what
  its jobs hold plus a margin: it cannot use it any more), then `TenantSlot.settle` (the
  tenant's slot counts the lease the pool said it has). In between, the tenant's slot counts
  more than the pool leases: under-used again.
- A crash between two steps loses the second. A lost apply or a lost settle leaves the
  tenant's slot counting more than the pool leases, until a reconciliation:
  `TenantSlot.sequences` (which grant each pool was given last), `PoolLease.fence` (in each
  pool: grants up to that one are applied or never will be), then `TenantSlot.settle` with
  each pool's answer.

Why a settle is exact: each grant to a pool carries the next number of the tenant's
sequence for that pool, and a pool applies a grant only above the latest number it applied
(or fenced): an apply delayed past a later one, or past a fence, is refused and its bytes
stay counted by the tenant's slot alone. A pool's lease grows only by a grant applied, so
when the tenant's slot still has the number a pool's answer carries, no grant was made since
the answer: the pool leases at most what it answered. The settle then lowers the tenant's
count to the answer (never raises it); with another number it changes nothing.

What holds after every step, crashes included (`problems`), for each tenant: what a pool's
jobs hold <= what the pool leases <= what the tenant's slot counts leased there, and the
tenant's slot counts at most quota + burst leased, beyond quota only through burst grants
(while its policy is not lowered: leases above a lowered quota stay until shrinks give them
back). The pools' jobs together then hold at most quota + burst, and at most quota while no
burst is leased.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Grant:
    """Bytes the tenant's slot leased to a pool, under the sequence number `seq` (0: none
    granted, nothing to apply)."""

    tenant: str
    pool: str
    granted: int
    seq: int


@dataclass(frozen=True)
class Standing:
    """What a pool's slot says of a tenant's lease after a shrink or a fence: the bytes it
    leases now, the latest grant number it applied or fenced, and what the shrink gave back."""

    tenant: str
    pool: str
    leased: int
    seq: int
    given: int = 0


@dataclass
class TenantSlot:
    """The tenant's slot: its quota, its burst, and per pool the bytes leased there and the
    number of the latest grant there."""

    quota: int = 0
    burst: int = 0
    leased: dict[str, int] = field(default_factory=dict)
    seq: dict[str, int] = field(default_factory=dict)

    def total(self) -> int:
        return sum(self.leased.values())

    def ask(self, pool: str, *, want: int, need: int, idle: bool) -> int:
        """How much a pool asks for, where its lease holds a job back that needs `need` more
        bytes and `want` would bring the lease up to the tenant's whole quota (quota + burst
        where `idle`). The whole of it while no other pool leases any of the tenant's quota:
        a tenant that uses one pool asks once. Else half of what is not leased (at least
        `need`): each pool that asks leaves some for the next, and a tenant's pools share
        its quota without waiting for housekeeping's rebalance each time."""
        if not any(bytes_ > 0 for other, bytes_ in self.leased.items() if other != pool):
            return want
        limit = self.quota + (self.burst if idle else 0)
        return min(want, max(need, (limit - self.total()) // 2))

    def set_policy(self, quota: int, burst: int) -> None:
        """A new quota and burst. Leases above a lowered quota stay until shrinks give them
        back; no grant is made meanwhile."""
        self.quota, self.burst = quota, burst

    def grant(self, tenant: str, pool: str, want: int, idle: bool) -> Grant:
        """Up to `want` bytes for `pool`, while the leases together stay within the quota,
        or within quota + burst for a pool with idle capacity (`idle`)."""
        limit = self.quota + (self.burst if idle else 0)
        granted = min(max(0, want), max(0, limit - self.total()))
        if granted <= 0:
            return Grant(tenant, pool, 0, 0)
        self.leased[pool] = self.leased.get(pool, 0) + granted
        self.seq[pool] = self.seq.get(pool, 0) + 1
        return Grant(tenant, pool, granted, self.seq[pool])

    def settle(self, standing: Standing) -> int:
        """A pool's answer (`PoolLease.shrink` or `fence`): the count for that pool drops to
        the lease the pool has when no grant was made there since; returns the count."""
        pool = standing.pool
        now = self.leased.get(pool, 0)
        if standing.seq == self.seq.get(pool, 0) and standing.leased < now:
            self.leased[pool] = now = standing.leased
        return now

    def sequences(self) -> dict[str, int]:
        """Each pool ever leased to, with the number of its latest grant (a reconciliation's
        first step)."""
        return dict(self.seq)


@dataclass
class PoolLease:
    """A tenant's lease in one pool's slot: the bytes leased to the pool, the bytes its
    running jobs hold, and the number of the latest grant applied or fenced."""

    leased: int = 0
    held: int = 0
    seq: int = 0

    def apply(self, grant: Grant) -> bool:
        """The pool may use the grant's bytes, unless a grant numbered as high or higher was
        applied or fenced first (this one is then lost: the tenant's slot counts it until a
        settle)."""
        if grant.granted <= 0 or grant.seq <= self.seq:
            return False
        self.leased += grant.granted
        self.seq = grant.seq
        return True

    def admit(self, cost: int) -> bool:
        """A job that holds `cost` bytes of its tenant's quota may run here: held + cost <=
        leased. The tenant's slot is not needed."""
        if self.held + cost > self.leased:
            return False
        self.held += cost
        return True

    def release(self, cost: int) -> int:
        """A job that held `cost` ended; returns what the jobs hold now."""
        self.held = max(0, self.held - cost)
        return self.held

    def shrink(self, tenant: str, pool: str, margin: int) -> Standing:
        """Gives back what the lease holds beyond held + margin (the pool cannot use it from
        now on); the answer is for the tenant's slot (`TenantSlot.settle`)."""
        given = max(0, self.leased - self.held - max(0, margin))
        self.leased -= given
        return Standing(tenant, pool, self.leased, self.seq, given)

    def fence(self, tenant: str, pool: str, seq: int) -> Standing:
        """Grants numbered up to `seq` are applied or refused from now on; the answer is for
        the tenant's slot (`TenantSlot.settle`)."""
        self.seq = max(self.seq, seq)
        return Standing(tenant, pool, self.leased, self.seq)


class LeaseModel:
    """Every tenant's slot and every pool's leases, in memory, driven one step at a time."""

    def __init__(self) -> None:
        self.tenants: dict[str, TenantSlot] = {}
        self.pools: dict[tuple[str, str], PoolLease] = {}  # (pool, tenant)

    def tenant(self, tenant: str) -> TenantSlot:
        return self.tenants.setdefault(tenant, TenantSlot())

    def lease(self, pool: str, tenant: str) -> PoolLease:
        return self.pools.setdefault((pool, tenant), PoolLease())

    def set_policy(self, tenant: str, quota: int, burst: int) -> None:
        self.tenant(tenant).set_policy(quota, burst)

    def grant(self, tenant: str, pool: str, want: int, idle: bool) -> Grant:
        return self.tenant(tenant).grant(tenant, pool, want, idle)

    def apply(self, grant: Grant) -> bool:
        return self.lease(grant.pool, grant.tenant).apply(grant)

    def admit(self, pool: str, tenant: str, cost: int) -> bool:
        return self.lease(pool, tenant).admit(cost)

    def release(self, pool: str, tenant: str, cost: int) -> int:
        return self.lease(pool, tenant).release(cost)

    def shrink(self, pool: str, tenant: str, margin: int) -> Standing:
        return self.lease(pool, tenant).shrink(tenant, pool, margin)

    def fence(self, pool: str, tenant: str, seq: int) -> Standing:
        return self.lease(pool, tenant).fence(tenant, pool, seq)

    def settle(self, standing: Standing) -> int:
        return self.tenant(standing.tenant).settle(standing)

    def sequences(self, tenant: str) -> dict[str, int]:
        return self.tenant(tenant).sequences()

    def reconcile(self, tenant: str) -> dict[str, int]:
        """A reconciliation with no step lost and nothing in between: each pool's count is
        then exactly what the pool leases."""
        for pool, seq in sorted(self.sequences(tenant).items()):
            self.settle(self.fence(pool, tenant, seq))
        return dict(self.tenant(tenant).leased)

    def problems(self, pools: Iterable[str] | None = None) -> list[str]:
        """What breaks the leases' invariant (see the module's docstring); [] when it holds."""
        return lease_problems(self.tenants, self.pools, pools)


def lease_problems(
    tenants: dict[str, TenantSlot],
    pools: dict[tuple[str, str], PoolLease],
    names: Iterable[str] | None = None,
) -> list[str]:
    """The invariant, checked on any tenants' slots and pools' leases (the model's, or what
    Redis holds, read back)."""
    found: list[str] = []
    pool_names = set(names or ()) | {pool for pool, _ in pools}
    for tenant, slot in sorted(tenants.items()):
        held_total = 0
        for pool in sorted(pool_names):
            lease = pools.get((pool, tenant), PoolLease())
            counted = slot.leased.get(pool, 0)
            held_total += lease.held
            if not 0 <= lease.held <= lease.leased <= counted:
                found.append(f"{tenant} in {pool}: held {lease.held}, leased {lease.leased}, "
                             f"counted {counted}")  # fmt: skip
        total = slot.total()
        if total > slot.quota + slot.burst:
            found.append(f"{tenant}: {total} leased, over quota + burst")
        if held_total > min(slot.quota + slot.burst, max(slot.quota, total)):
            found.append(f"{tenant}: {held_total} held, over what its leases allow")
    return found

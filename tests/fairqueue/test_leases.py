"""A tenant's quota leased to pools (fairqueue/leases_model.py, fairqueue/leases.py,
fairqueue/lua/lease_*.lua): the rules on the pure model; then the Lua functions against the
model, step by step, over random sequences of grants, applies, admissions, releases,
shrinks, reconciliations and crashes between two steps, on one Redis and on a real cluster
of three primaries, with the invariant checked on what Redis holds after every step."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster as PyRedisCluster
from redis.crc import key_slot

from fairqueue import library
from fairqueue.keys import Keys
from fairqueue.leases import Leases
from fairqueue.leases_model import (
    Grant,
    LeaseModel,
    PoolLease,
    Standing,
    TenantSlot,
    lease_problems,
)
from tests.support.redis_cluster import RedisCluster

# --- the model ----------------------------------------------------------------------------


def model_with(quota: int, burst: int = 0) -> LeaseModel:
    model = LeaseModel()
    model.set_policy("t", quota, burst)
    return model


def test_grants_stay_within_the_quota_and_burst_goes_only_to_an_idle_pool() -> None:
    model = model_with(10, 4)
    assert model.grant("t", "p1", 6, idle=False).granted == 6
    assert model.grant("t", "p2", 9, idle=False).granted == 4  # the quota's rest
    assert model.grant("t", "p2", 9, idle=False) == Grant("t", "p2", 0, 0)  # no number taken
    assert model.grant("t", "p3", 9, idle=True).granted == 4  # the burst, to an idle pool
    assert model.grant("t", "p3", 1, idle=True).granted == 0
    assert model.tenant("t").total() == 14
    assert model.tenant("t").seq == {"p1": 1, "p2": 1, "p3": 1}


def test_a_pool_admits_within_its_lease_without_the_tenants_slot() -> None:
    model = model_with(10)
    assert not model.admit("p1", "t", 1)  # nothing leased yet
    assert model.apply(model.grant("t", "p1", 5, idle=False))
    assert model.admit("p1", "t", 3)
    assert not model.admit("p1", "t", 3)  # 6 > 5
    assert model.admit("p1", "t", 2)
    assert model.release("p1", "t", 3) == 2
    assert model.problems() == []


def test_a_shrink_keeps_what_the_jobs_hold_plus_the_margin_and_the_tenant_counts_it_back() -> None:
    model = model_with(10)
    model.apply(model.grant("t", "p1", 8, idle=False))
    model.admit("p1", "t", 3)
    answer = model.shrink("p1", "t", margin=1)
    assert answer == Standing("t", "p1", leased=4, seq=1, given=4)
    assert model.tenant("t").leased == {"p1": 8}  # until the settle: under-used
    assert model.problems() == []
    assert model.settle(answer) == 4
    assert model.grant("t", "p2", 10, idle=False).granted == 6


def test_a_crash_between_grant_and_apply_under_uses_the_quota_until_a_reconciliation() -> None:
    model = model_with(10)
    lost = model.grant("t", "p1", 6, idle=False)  # never applied: the dispatcher died
    assert model.apply(model.grant("t", "p2", 9, idle=False))
    assert model.tenant("t").leased == {"p1": 6, "p2": 4}
    assert model.problems() == []
    assert model.reconcile("t") == {"p1": 0, "p2": 4}
    assert not model.apply(lost)  # it arrives after all: fenced, refused
    assert model.grant("t", "p1", 9, idle=False).granted == 6
    assert model.problems() == []


def test_a_crash_between_the_two_steps_of_a_shrink_under_uses_until_a_reconciliation() -> None:
    model = model_with(10)
    model.apply(model.grant("t", "p1", 10, idle=False))
    model.shrink("p1", "t", margin=2)  # the settle is lost
    assert model.grant("t", "p2", 1, idle=False).granted == 0
    assert model.reconcile("t") == {"p1": 2}
    assert model.grant("t", "p2", 9, idle=False).granted == 8


def test_a_late_apply_is_refused_and_its_bytes_stay_counted() -> None:
    model = model_with(10)
    first = model.grant("t", "p1", 3, idle=False)
    second = model.grant("t", "p1", 3, idle=False)
    assert model.apply(second)
    assert not model.apply(first)  # numbered below the one applied
    assert model.lease("p1", "t").leased == 3
    assert model.tenant("t").leased == {"p1": 6}
    assert model.problems() == []
    assert model.reconcile("t") == {"p1": 3}


def test_a_settle_told_after_a_newer_grant_changes_nothing() -> None:
    """The pool answered before a grant it then applied: lowering the count to that answer
    would count less than the pool leases, so the settle leaves the count as it is."""
    model = model_with(10)
    model.apply(model.grant("t", "p1", 4, idle=False))
    answer = model.shrink("p1", "t", margin=0)  # gives back 4, leases 0
    model.apply(model.grant("t", "p1", 5, idle=False))
    assert model.settle(answer) == 9
    assert model.problems() == []
    assert model.reconcile("t") == {"p1": 5}


def test_a_settle_never_raises_the_count() -> None:
    """Two shrinks settled in the wrong order: the older answer (more leased) comes last."""
    model = model_with(10)
    model.apply(model.grant("t", "p1", 8, idle=False))
    model.admit("p1", "t", 2)
    older = model.shrink("p1", "t", margin=4)
    model.release("p1", "t", 2)
    newer = model.shrink("p1", "t", margin=0)
    assert model.settle(newer) == 0
    assert model.settle(older) == 0
    assert model.problems() == []


def test_a_lowered_quota_is_granted_nothing_until_shrinks_bring_the_leases_under_it() -> None:
    model = model_with(10)
    model.apply(model.grant("t", "p1", 10, idle=False))
    model.set_policy("t", 4, 0)
    assert model.grant("t", "p2", 1, idle=False).granted == 0
    model.settle(model.shrink("p1", "t", margin=0))
    assert model.grant("t", "p2", 9, idle=False).granted == 4


def test_the_invariant_names_what_breaks_it() -> None:
    model = model_with(4)
    model.lease("p1", "t").leased = 2  # as if a grant were applied that the tenant never made
    assert model.problems() == ["t in p1: held 0, leased 2, counted 0"]
    model.tenant("t").leased["p1"] = 6
    model.lease("p1", "t").leased, model.lease("p1", "t").held = 6, 6
    assert model.problems() == [
        "t: 6 leased, over quota + burst",
        "t: 6 held, over what its leases allow",
    ]


# --- random sequences, on the model and on Redis ------------------------------------------

POLICIES = {"a": (6, 6), "b": (6, 0)}  # quota, burst
POOLS = ("p1", "p2", "gpu:h100")  # a pool name may hold ':'
KINDS = (
    *("grant",) * 4, *("apply",) * 4, *("admit",) * 6, *("release",) * 2, *("shrink",) * 3,
    *("settle",) * 3, "reconcile_begin", *("fence",) * 2, "crash", "reconcile",
)  # fmt: skip


@dataclass
class Pending:
    """Steps begun and not finished: their second steps, in any order, or lost (crash)."""

    grants: list[Grant] = field(default_factory=list)  # to apply
    fences: list[tuple[str, str, int]] = field(default_factory=list)  # pool, tenant, seq
    answers: list[Standing] = field(default_factory=list)  # to settle
    jobs: list[tuple[str, str, int]] = field(default_factory=list)  # running: pool, tenant, cost


def take(rng: random.Random, items: list[Any]) -> Any:
    return items.pop(rng.randrange(len(items)))


def step(rng: random.Random, model: LeaseModel, leases: Leases | None, pending: Pending) -> str:
    """One random step on the model and, where given, the same on Redis; their answers
    agree. Returns what happened: the step's kind, and for some its outcome."""
    kind = rng.choice(KINDS)
    outcome = ""
    tenant, pool = rng.choice(sorted(POLICIES)), rng.choice(POOLS)

    def both(name: str, *args: Any, **kwargs: Any) -> Any:
        expected = getattr(model, name)(*args, **kwargs)
        if leases is not None:
            got = getattr(leases, name)(*args, **kwargs)
            assert got == expected, (name, args, got, expected)
        return expected

    if kind == "grant":
        idle = rng.random() < 0.5
        grant = both("grant", tenant, pool, rng.randint(1, 8), idle=idle)
        if grant.granted:
            pending.grants.append(grant)
        if model.tenant(tenant).total() > model.tenant(tenant).quota:
            outcome = ":burst"
    elif kind == "apply" and pending.grants:
        outcome = ":applied" if both("apply", take(rng, pending.grants)) else ":refused"
    elif kind == "admit":
        cost = rng.randint(1, 4)
        if both("admit", pool, tenant, cost):
            pending.jobs.append((pool, tenant, cost))
            held = sum(model.lease(p, tenant).held for p in POOLS)
            outcome = ":over_quota" if held > model.tenant(tenant).quota else ""
    elif kind == "release" and pending.jobs:
        both("release", *take(rng, pending.jobs))
    elif kind == "shrink":
        pending.answers.append(both("shrink", pool, tenant, rng.randint(0, 2)))
    elif kind == "settle" and pending.answers:
        answer = take(rng, pending.answers)
        counted = model.tenant(answer.tenant).leased.get(answer.pool, 0)
        outcome = ":lowered" if both("settle", answer) < counted else ":kept"
    elif kind == "reconcile_begin":
        for name, seq in sorted(both("sequences", tenant).items()):
            pending.fences.append((name, tenant, seq))
    elif kind == "fence" and pending.fences:
        pending.answers.append(both("fence", *take(rng, pending.fences)))
    elif kind == "crash":
        lists = [items for items in (pending.grants, pending.fences, pending.answers) if items]
        if lists:
            take(rng, rng.choice(lists))  # the step's second half never comes
    elif kind == "reconcile":
        both("reconcile", tenant)
    return kind + outcome


def state(leases: Leases) -> tuple[dict[str, Any], dict[tuple[str, str], PoolLease]]:
    """What Redis holds, read back as the model's types."""
    tenants = {tenant: leases.tenant_slot(tenant) for tenant in POLICIES}
    pools = {(p, t): leases.pool_lease(p, t) for p in POOLS for t in POLICIES}
    return tenants, pools


def check_quota_holds(tenants: dict[str, Any], pools: dict[tuple[str, str], PoolLease]) -> None:
    assert lease_problems(tenants, pools, POOLS) == []
    for tenant, (quota, burst) in POLICIES.items():
        held = sum(pools.get((pool, tenant), PoolLease()).held for pool in POOLS)
        assert held <= quota + burst
        if tenants[tenant].total() <= quota:  # no burst leased: the quota alone
            assert held <= quota


def run_sequence(seed: int, steps: int, leases: Leases | None) -> set[str]:
    rng = random.Random(seed)
    model, pending = LeaseModel(), Pending()
    for tenant, (quota, burst) in POLICIES.items():
        model.set_policy(tenant, quota, burst)
        if leases is not None:
            leases.set_policy(tenant, quota, burst)
    kinds: set[str] = set()
    for _ in range(steps):
        kinds.add(step(rng, model, leases, pending))
        check_quota_holds(model.tenants, model.pools)
        if leases is not None:
            tenants, pools = state(leases)
            check_quota_holds(tenants, pools)
            assert tenants == model.tenants
            assert pools == {key: model.pools.get(key, PoolLease()) for key in pools}
    return kinds


# What a sequence is to go through (besides every kind of step): a burst leased and held,
# an apply refused (late, or fenced), a settle that lowers the count and one that keeps it.
SEEN = {"grant:burst", "admit:over_quota", "apply:applied", "apply:refused", "settle:lowered",
        "settle:kept"}  # fmt: skip


@pytest.mark.parametrize("first", range(0, 400, 40))
def test_the_quota_holds_on_the_model_over_random_sequences(first: int) -> None:
    seen: set[str] = set()
    for seed in range(first, first + 40):
        seen |= run_sequence(seed, 300, None)
    assert {kind.partition(":")[0] for kind in seen} == set(KINDS)
    assert seen >= SEEN


# Sequences that go through all of SEEN each (most do; a burst held beyond the quota is the
# rarest, as the tenant's slot also counts the grants and shrinks still on their way).
SEEDS = (2, 7, 9)
STEPS = 300


@pytest.fixture
def leases(fq_redis: redis.Redis) -> Leases:
    return Leases(fq_redis)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_functions_decide_as_the_model_does_on_one_redis(leases: Leases, seed: int) -> None:
    assert run_sequence(seed, STEPS, leases) >= SEEN


def test_each_function_touches_one_slot_named_by_its_key(leases: Leases) -> None:
    keys = Keys()
    assert keys.lease_quota("acme") == "gs:fq:{t:acme}:quota"
    assert keys.lease("gpu:h100", "acme") == "gs:fq:{p:gpu:h100}:lease:acme"
    assert key_slot(b"{t:acme}") == key_slot(keys.lease_quota("acme").encode())
    assert key_slot(b"{p:gpu:h100}") == key_slot(keys.lease("gpu:h100", "acme").encode())
    with pytest.raises(ValueError, match="braces"):
        leases.admit("p}1", "acme", 1)
    with pytest.raises(ValueError, match="tenant"):
        leases.grant("a:b", "p1", 1)


def test_a_redis_that_lost_the_library_gets_it_again(leases: Leases, fq_redis: redis.Redis) -> None:
    leases.set_policy("t", 4)
    fq_redis.function_flush()
    assert leases.grant("t", "p1", 3).granted == 3
    assert any(library.library_name() in str(entry) for entry in fq_redis.function_list())


# --- on a cluster -------------------------------------------------------------------------


@pytest.fixture
def cluster_leases(cluster: RedisCluster) -> Iterator[Leases]:
    client = PyRedisCluster.from_url(cluster.url, decode_responses=True)
    client.flushall()  # every primary
    client.function_flush()
    yield Leases(client)
    client.close()


def test_the_tenants_and_pools_slots_are_spread_over_the_primaries(
    cluster: RedisCluster, cluster_leases: Leases
) -> None:
    client = cluster_leases.redis
    assert isinstance(client, PyRedisCluster)
    keys = [Keys().lease_quota(t) for t in POLICIES]
    keys += [Keys().lease(p, t) for p in POOLS for t in POLICIES]
    assert len({client.get_node_from_key(key).port for key in keys}) > 1


@pytest.mark.parametrize("seed", SEEDS)
def test_the_functions_decide_as_the_model_does_on_a_cluster(
    cluster_leases: Leases, seed: int
) -> None:
    assert run_sequence(seed, STEPS, cluster_leases) >= SEEN


def test_a_pool_asks_the_whole_quota_alone_and_half_of_what_is_free_beside_others() -> None:
    slot = TenantSlot(quota=100, burst=20)
    assert slot.ask("p", want=100, need=10, idle=False) == 100  # no other pool leases any
    slot.leased = {"p": 40, "q": 0}
    assert slot.ask("p", want=60, need=10, idle=False) == 60  # q leases nothing: still alone
    assert slot.ask("q", want=100, need=10, idle=False) == 30  # half of the 60 not leased
    assert slot.ask("q", want=120, need=10, idle=True) == 40  # the burst counts when idle
    assert slot.ask("q", want=100, need=45, idle=False) == 45  # at least what the job needs
    assert slot.ask("q", want=20, need=10, idle=False) == 20  # never more than it wanted

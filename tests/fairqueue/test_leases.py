"""A tenant's quota leased to pools: the rules on the pure model
(fairqueue/leases_model.py)."""

from fairqueue.leases_model import Grant, LeaseModel, Standing

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

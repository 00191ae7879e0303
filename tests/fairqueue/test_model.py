"""Properties of the pick rule, on the pure reference model (no Redis)."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairqueue import EnginePolicy, JobRejected, TenantPolicy
from fairqueue.model import (
    FairModel,
    ModelJob,
    class_order,
    jain_index,
    lifted_counter,
    token_charge,
)

CLASSES = ("interactive", "standard", "offline")
WEIGHTS = {"interactive": 8.0, "standard": 3.0, "offline": 1.0}
TENANTS = {
    "a": TenantPolicy(1, 4, 2),
    "b": TenantPolicy(2, 3, 0),
    "c": TenantPolicy(5, 6, 4),
}
ENGINES = {
    "e1": EnginePolicy("e1", "p", 6, 3, 0.4, 0.0, offline_gate_margin=0.25, offline_reserve=1),
    # e2 lets the classes below interactive hold one seat of its three (a fixed bound).
    "e2": EnginePolicy("e2", "p", 9, 2, 0.4, 0.0, queued=1, fixed_seats_below={"interactive": 1}),
}

# An operation: (kind, a, b, c, d) with small integers whose meaning depends on the kind.
OPERATION_KINDS = ["enqueue"] * 3 + ["pick"] * 3 + ["release"] * 2 + ["cancel", "requeue", "load"]
operations = st.lists(
    st.tuples(st.sampled_from(OPERATION_KINDS), *[st.integers(0, 8)] * 4),
    min_size=10,
    max_size=60,
)


def test_vtc_charges_output_twice_and_divides_by_weight() -> None:
    assert token_charge(100, 50, 2.0) == 100
    assert token_charge(10, 0, 1.0) == 10


def test_a_newly_backlogged_counter_is_lifted_not_lowered() -> None:
    assert lifted_counter(3.0, [10.0, 7.0], seated=0.0) == 7.0
    assert lifted_counter(30.0, [10.0, 7.0], seated=0.0) == 30.0
    assert lifted_counter(3.0, [], seated=5.0) == 5.0
    # Never below where the engines' service has got to, backlog or not.
    assert lifted_counter(3.0, [6.0], seated=8.0) == 8.0


def test_a_tenant_that_sent_less_than_its_share_keeps_its_place_among_the_seated_jobs() -> None:
    """With nobody backlogged (every job is in the engine), a tenant is lifted to the seated
    stamp only, not to the counter of whoever was picked last: a tenant of weight 4 that sends
    as much as one of weight 1 keeps stamps below it, so the engine (seating the lowest stamp
    first, one at a time here) serves it first."""
    engines = {"e": EnginePolicy("e", "p", 10**9, 10**6, 0.4, 0.0)}
    tenants = {"heavy": TenantPolicy(4, 10**9), "light": TenantPolicy(1, 10**9)}
    model = FairModel(WEIGHTS, tenants, engines)
    running: list[ModelJob] = []
    served: list[str] = []
    for serial in range(8):
        for tenant in ("light", "heavy"):
            model.enqueue(ModelJob(f"{tenant}{serial}", tenant, "standard", 10, 10, 1))
            job = model.pick("e")
            assert job is not None
            running.append(job)
        if serial:
            heavy, light = running[-1], running[-2]
            assert heavy.stamp < light.stamp
        first = min(running, key=lambda job: (job.stamp, job.job_id))
        running.remove(first)
        model.release(first.job_id, 10, 10)
        served.append(first.tenant)
    assert served.count("heavy") >= 3 * served.count("light")


def test_classes_are_tried_least_virtual_time_first_ties_to_the_higher_class() -> None:
    assert class_order({"interactive": 1.0, "standard": 0.5}, CLASSES) == [
        "offline",
        "standard",
        "interactive",
    ]
    assert class_order({}, ["offline", "interactive"]) == ["interactive", "offline"]


def test_jains_index_is_one_for_equal_and_one_over_n_for_one_winner() -> None:
    assert jain_index([2, 2, 2]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)


def fresh_model(engines: dict[str, EnginePolicy] | None = None) -> FairModel:
    return FairModel(WEIGHTS, TENANTS, engines or ENGINES)


def heads_admissible(model: FairModel, engine_id: str, within_quota_only: bool) -> list[ModelJob]:
    """Every head job of an open class that the engine could run now."""
    engine = model.engines[engine_id]
    if model.engine_inflight[engine_id] >= engine.max_in_flight:
        return []
    free_bytes = engine.kv_budget_bytes - model.engine_reserved[engine_id]
    found = []
    for (request_class, tenant), queue in model.queues.items():
        if not queue or request_class not in model.open_classes(engine_id):
            continue
        job = model.jobs[queue[0]]
        policy = model.tenants[tenant]
        limit = policy.quota_bytes + (0 if within_quota_only else policy.burst_bytes)
        if job.kv_bytes <= free_bytes and model.tenant_reserved[tenant] + job.kv_bytes <= limit:
            found.append(job)
    return found


def random_job(op: tuple[str, int, int, int, int], serial: int) -> ModelJob:
    """The job an `enqueue` operation makes: a tenant, a class, tokens, KV bytes, seats and
    an affinity key (its tenant's, one in three with none)."""
    _, x, y, z, w = op
    tenant, request_class, kv_bytes = "abc"[x % 3], CLASSES[y % 3], 1 + (x + z) % 7
    affinity = "" if (y + z) % 3 == 0 else f"k-{tenant}"
    return ModelJob(
        f"j{serial}", tenant, request_class, 1 + z, 1 + w, kv_bytes, seqs=1 + w % 3,
        affinity=affinity,
    )  # fmt: skip


def apply(model: FairModel, op: tuple[str, int, int, int, int], serial: int) -> None:
    kind, x, y, z, _ = op
    running = sorted(j.job_id for j in model.jobs.values() if j.state == "running")
    queued = sorted(j.job_id for j in model.jobs.values() if j.state == "queued")
    if kind == "enqueue":
        job = random_job(op, serial)
        try:
            model.enqueue(job)
        except JobRejected:
            assert job.kv_bytes > TENANTS[job.tenant].quota_bytes + TENANTS[job.tenant].burst_bytes
    elif kind == "pick":
        check_pick(model, "e1" if x % 2 == 0 else "e2")
    elif kind == "release" and running:
        assert model.release(running[x % len(running)], 1 + y, z)
    elif kind == "cancel" and (running or queued):
        pool = running + queued
        assert model.cancel(pool[x % len(pool)]) in ("queued", "running")
    elif kind == "requeue" and running:
        assert model.requeue(running[x % len(running)])
    elif kind == "load":
        model.set_load("e1" if x % 2 == 0 else "e2", y / 8)


def check_pick(model: FairModel, engine_id: str) -> None:
    engine = model.engines[engine_id]
    within_quota = heads_admissible(model, engine_id, within_quota_only=True)
    with_burst = heads_admissible(model, engine_id, within_quota_only=False)
    gate = model.offline_gate(engine_id)
    offline_seats = model.engine_offline[engine_id]
    job = model.pick(engine_id)
    if job is None:
        assert with_burst == []  # work-conserving: nothing that could run was left waiting
        return
    if job.request_class == "offline":
        assert gate == ""
        assert engine.load < engine.offline_load_threshold
        # offline never takes a seat beyond the seats left free less the reserve
        assert offline_seats < engine.max_num_seqs - engine.offline_reserve
    policy = model.tenants[job.tenant]
    if model.tenant_reserved[job.tenant] > policy.quota_bytes:
        assert within_quota == []  # burst only while nobody waits within quota


def check_invariants(model: FairModel) -> None:
    running = [j for j in model.jobs.values() if j.state == "running"]
    for tenant, policy in model.tenants.items():
        held = sum(j.kv_bytes for j in running if j.tenant == tenant)
        assert model.tenant_reserved[tenant] == held
        assert 0 <= held <= policy.quota_bytes + policy.burst_bytes
    for engine_id, engine in model.engines.items():
        mine = [j for j in running if j.engine_id == engine_id]
        assert model.engine_reserved[engine_id] == sum(j.kv_bytes for j in mine)
        assert 0 <= model.engine_reserved[engine_id] <= engine.kv_budget_bytes
        # Seats count sequences; a job of several is picked while one seat is free.
        assert model.engine_inflight[engine_id] == sum(j.seqs for j in mine)
        widest = max((j.seqs for j in mine), default=1)
        assert model.engine_inflight[engine_id] <= engine.max_in_flight - 1 + widest
    for (request_class, tenant), queue in model.queues.items():
        for job_id in queue:
            job = model.jobs[job_id]
            assert (job.state, job.request_class, job.tenant) == ("queued", request_class, tenant)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_reservations_are_conserved_and_bounded_under_any_sequence(
    ops: list[tuple[str, int, int, int, int]],
) -> None:
    model = fresh_model()
    for serial, op in enumerate(ops):
        apply(model, op, serial)
        check_invariants(model)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 10),
    st.integers(1, 10),
    st.integers(1, 10),
)
def test_no_class_starves_and_shares_follow_class_weights(
    interactive: int, standard: int, offline: int
) -> None:
    weights = {"interactive": float(interactive), "standard": float(standard),
               "offline": float(offline)}  # fmt: skip
    engines = {"e": EnginePolicy("e", "p", 10**9, 1, 0.4, 0.0)}
    model = FairModel(weights, {"t": TenantPolicy(1, 10**9)}, engines)
    rounds = 5
    total = rounds * (interactive + standard + offline)
    for serial in range(total):
        for request_class in CLASSES:
            model.enqueue(ModelJob(f"{request_class}{serial}", "t", request_class, 1, 1, 1))
    order = []
    for _ in range(total):
        job = model.pick("e")
        assert job is not None
        order.append(job.request_class)
        model.release(job.job_id, 1, 1)
    counts = Counter(order)
    for request_class, weight in weights.items():
        assert abs(counts[request_class] - rounds * weight) <= 1
    window = int(sum(weights.values()) / min(weights.values())) + 2
    for request_class in CLASSES:
        seen_at = [i for i, name in enumerate(order) if name == request_class]
        assert seen_at[0] < window


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 30), st.floats(0.4, 1.0))
def test_offline_is_never_picked_at_or_over_the_threshold(jobs: int, load: float) -> None:
    engines = {"e": EnginePolicy("e", "p", 10**9, 10**6, 0.4, load)}
    model = FairModel(WEIGHTS, {"t": TenantPolicy(1, 10**9)}, engines)
    for serial in range(jobs):
        model.enqueue(ModelJob(f"o{serial}", "t", "offline", 1, 1, 1))
        model.enqueue(ModelJob(f"s{serial}", "t", "standard", 1, 1, 1))
    picked = [model.pick("e") for _ in range(2 * jobs)]
    assert [job.request_class for job in picked if job] == ["standard"] * jobs


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=30))
def test_a_newly_backlogged_tenant_starts_at_the_least_backlogged_counter(
    prompts: list[int],
) -> None:
    engines = {"e": EnginePolicy("e", "p", 10**9, 10**6, 0.4, 0.0)}
    model = FairModel(WEIGHTS, {"a": TenantPolicy(1, 10**9), "b": TenantPolicy(1, 10**9)},
                      engines)  # fmt: skip
    for serial, prompt in enumerate(prompts):
        model.enqueue(ModelJob(f"a{serial}", "a", "standard", prompt, 0, 1))
    model.enqueue(ModelJob("a-last", "a", "standard", 1, 0, 1))  # a stays backlogged
    for _ in prompts:
        job = model.pick("e")
        assert job is not None
        model.release(job.job_id, job.prompt_tokens, 0)
    model.enqueue(ModelJob("b0", "b", "standard", 1, 0, 1))
    assert model.counters[("standard", "b")] == model.counters[("standard", "a")] == sum(prompts)


def test_the_load_closes_the_gate_at_the_threshold_and_reopens_below_the_margin() -> None:
    engines = {"e": EnginePolicy("e", "p", 10**9, 16, 0.4, 0.0, offline_gate_margin=0.1)}
    model = FairModel(WEIGHTS, {"t": TenantPolicy(1, 10**9)}, engines)
    readings = [0.3, 0.4, 0.35, 0.31, 0.29, 0.35, 0.39, 0.41]
    gates = []
    for load in readings:
        model.set_load("e", load)
        gates.append(model.offline_gate("e"))
    assert gates == ["", "load", "load", "load", "", "", "", "load"]


def test_online_seats_close_the_gate_at_once_and_offline_fills_the_seats_left() -> None:
    # 10 seats, 2 kept for online work arriving; online at 4 seats (0.4) closes the gate.
    engines = {"e": EnginePolicy("e", "p", 10**9, 10, 0.4, 0.0, offline_reserve=2)}
    model = FairModel(WEIGHTS, {"t": TenantPolicy(1, 10**9)}, engines)
    for serial in range(20):
        model.enqueue(ModelJob(f"o{serial}", "t", "offline", 1, 1, 1))
    offline = [model.pick("e") for _ in range(10)]
    assert sum(job is not None for job in offline) == 8  # every seat but the reserve
    assert model.offline_gate("e") == "seats"
    for job in offline[:5]:
        assert job is not None
        model.release(job.job_id, 1, 1)
    for serial in range(4):
        model.enqueue(ModelJob(f"s{serial}", "t", "standard", 1, 1, 1))
    picked = [model.pick("e") for _ in range(5)]
    assert [job.request_class for job in picked if job] == ["standard"] * 4
    assert model.offline_gate("e") == "online_seats"  # 4 online seats of 10
    model.release(picked[0].job_id, 1, 1)  # type: ignore[union-attr]
    assert model.offline_gate("e") == ""

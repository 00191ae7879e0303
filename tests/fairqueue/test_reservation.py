"""KV reservations on the real scripts: the worst case, or a prediction that grows
(lua/lib.lua `job_cost`, `engine_free`, `observe_output`; lua/grow.lua; lua/set_load.lua)."""

from dataclasses import replace

import pytest

from fairqueue import EnginePolicy, FairQueue, Job, JobRejected, TenantPolicy

TOKEN = 1000  # bytes per generated token
FLOOR = 100 * TOKEN  # the prompt's bytes, with a block of output
MAX_TOKENS = 1000
WORST = FLOOR + MAX_TOKENS * TOKEN
BUDGET = 4 * WORST  # four jobs at their worst case
PLENTY = 1000 * WORST


def engine(mode: str = "predict", seats: int = 64, quantile: float = 0.95) -> EnginePolicy:
    return EnginePolicy("e1", "p", BUDGET, seats, reservation=mode, output_quantile=quantile)


def submit(
    fq: FairQueue,
    tenant: str = "a",
    *,
    max_tokens: int = MAX_TOKENS,
    observed: bool = True,
    now: float = 0,
) -> Job:
    return fq.enqueue(
        tenant=tenant, pool="p", request_class="standard", prompt_tokens=90,
        max_tokens=max_tokens, kv_bytes=FLOOR + max_tokens * TOKEN, kv_floor=FLOOR,
        kv_token=TOKEN, observed=observed, now=now,
    )  # fmt: skip


def pick_all(fq: FairQueue, now: float = 1) -> list[Job]:
    picked = []
    while (job := fq.pick("p", "e1", now=now)) is not None:
        picked.append(job)
    return picked


def teach(fq: FairQueue, lengths: list[int], tenant: str = "a") -> None:
    """Runs one job per length to its end, one at a time, so the tenant's answers are seen."""
    for length in lengths:
        job = submit(fq, tenant)
        picked = fq.pick("p", "e1", now=1)
        assert picked is not None
        assert picked.job_id == job.job_id
        assert fq.release(job.pool, job.job_id, 90, length, now=2)


def tenant_reserved(fq: FairQueue, tenant: str = "a") -> int:
    return fq.tenant_held_bytes([tenant])[tenant]


def engine_reserved(fq: FairQueue) -> int:
    return int(fq.redis.hget(fq.keys.engine_usage("p", "e1"), "reserved") or 0)


@pytest.fixture
def tenant(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, PLENTY))


@pytest.mark.usefixtures("tenant")
def test_the_worst_case_mode_reserves_every_token_a_job_may_generate(fq: FairQueue) -> None:
    fq.set_engine_policy(engine("worst"))
    teach(fq, [50] * 10)
    for _ in range(6):
        submit(fq)
    picked = pick_all(fq)
    assert len(picked) == 4
    assert {job.reserved for job in picked} == {WORST}
    assert {job.covered_tokens for job in picked} == {-1}


@pytest.mark.usefixtures("tenant")
def test_a_tenant_with_few_answers_seen_reserves_its_worst_case(fq: FairQueue) -> None:
    fq.set_engine_policy(engine())
    teach(fq, [50] * 7)
    assert fq.output_predictions("p") == {}
    for _ in range(6):
        submit(fq)
    assert len(pick_all(fq)) == 4


@pytest.mark.usefixtures("tenant")
def test_a_prediction_runs_as_many_jobs_as_their_predicted_kv_fits(fq: FairQueue) -> None:
    fq.set_engine_policy(engine())
    teach(fq, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    # Nearest rank: the 10th of 10 at quantile 0.95.
    assert fq.output_predictions("p") == {"a": 100}
    for _ in range(40):
        submit(fq)
    picked = pick_all(fq)
    cost = FLOOR + 100 * TOKEN
    assert len(picked) == BUDGET // cost
    assert {job.reserved for job in picked} == {cost}
    assert {job.covered_tokens for job in picked} == {100}
    assert engine_reserved(fq) == tenant_reserved(fq) == len(picked) * cost
    assert fq.check().ok


@pytest.mark.usefixtures("tenant")
def test_the_quantile_follows_the_latest_answers(fq: FairQueue) -> None:
    fq.set_engine_policy(engine(quantile=0.5))
    teach(fq, [10] * 8 + [500] * 64)
    assert fq.output_predictions("p") == {"a": 500}  # the 10s have left the window
    teach(fq, [20] * 40)
    assert fq.output_predictions("p") == {"a": 20}


@pytest.mark.usefixtures("tenant")
def test_a_full_window_is_predicted_again_every_eighth_answer(fq: FairQueue) -> None:
    # lib.lua observe_output: a full window takes 7 more answers, then is cut back to the
    # latest 64 and sorted again.
    fq.set_engine_policy(engine(quantile=0.95))
    teach(fq, [10] * 64)
    assert fq.output_predictions("p") == {"a": 10}
    teach(fq, [500] * 7)
    assert fq.output_predictions("p") == {"a": 10}  # the 61st of 64 was 500 by the 4th
    teach(fq, [500])
    assert fq.output_predictions("p") == {"a": 500}


@pytest.mark.usefixtures("tenant")
def test_a_job_that_asks_for_fewer_tokens_than_predicted_reserves_what_it_asked(
    fq: FairQueue,
) -> None:
    fq.set_engine_policy(engine())
    teach(fq, [100] * 8)
    submit(fq, max_tokens=20)
    picked = fq.pick("p", "e1", now=1)
    assert picked is not None
    assert picked.reserved == picked.kv_bytes == FLOOR + 20 * TOKEN
    assert picked.covered_tokens == -1  # its worst case: nothing to grow into


@pytest.mark.usefixtures("tenant")
def test_a_job_grows_past_its_prediction_up_to_its_worst_case(fq: FairQueue) -> None:
    fq.set_engine_policy(engine())
    teach(fq, [50] * 8)
    submit(fq)
    job = fq.pick("p", "e1", now=1)
    assert job is not None
    assert job.covered_tokens == 50
    assert fq.grow(job.pool, job.job_id, job.attempt, 40, now=2) == 50  # within: nothing moves
    assert engine_reserved(fq) == FLOOR + 50 * TOKEN
    assert fq.grow(job.pool, job.job_id, job.attempt, 60, now=2) == 120  # as many again
    assert engine_reserved(fq) == tenant_reserved(fq) == FLOOR + 120 * TOKEN
    assert fq.grow(job.pool, job.job_id, job.attempt, 700, now=3) == -1  # its worst case, at most
    assert engine_reserved(fq) == tenant_reserved(fq) == WORST
    assert fq.check().ok
    assert fq.grow(job.pool, job.job_id, job.attempt + 1, 800, now=3) == -2  # not that attempt's
    assert fq.release(job.pool, job.job_id, 90, 800, now=4)
    assert engine_reserved(fq) == tenant_reserved(fq) == 0
    assert fq.grow(job.pool, job.job_id, job.attempt, 900, now=5) == -2  # released: nothing to grow
    assert engine_reserved(fq) == 0


def test_a_job_nobody_counts_holds_its_worst_case_of_its_tenants_quota(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, PLENTY))
    fq.set_engine_policy(engine())
    teach(fq, [50] * 8)
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * WORST))
    for _ in range(3):
        submit(fq, observed=False)
    picked = pick_all(fq)
    assert len(picked) == 2  # the quota holds two worst cases
    assert {job.reserved for job in picked} == {FLOOR + 50 * TOKEN}  # the engine, predicted
    assert tenant_reserved(fq) == 2 * WORST
    assert engine_reserved(fq) == 2 * (FLOOR + 50 * TOKEN)
    assert fq.check().ok
    for job in picked:
        fq.release(job.pool, job.job_id, 90, 50, now=2)
    assert tenant_reserved(fq) == engine_reserved(fq) == 0


def test_where_it_predicts_a_job_larger_than_the_quota_runs_alone(fq: FairQueue) -> None:
    ceiling = WORST // 2  # the quota holds half a worst case, all prompts
    fq.set_tenant_policy("a", TenantPolicy(1, ceiling))
    fq.set_engine_policy(engine("worst"))
    with pytest.raises(JobRejected) as refused:
        submit(fq)
    assert refused.value.reason == "larger_than_quota"
    fq.set_engine_policy(engine("predict"))
    first, second = submit(fq), submit(fq)
    job = fq.pick("p", "e1", now=1)
    assert job is not None
    assert job.job_id == first.job_id
    assert job.reserved == WORST  # nothing seen yet
    assert tenant_reserved(fq) == ceiling  # its whole quota, no more
    assert fq.pick("p", "e1", now=1) is None  # the next one waits for it
    assert fq.grow(job.pool, job.job_id, job.attempt, 999, now=2) == -1
    assert tenant_reserved(fq) == ceiling
    fq.release(job.pool, job.job_id, 90, 999, now=3)
    assert tenant_reserved(fq) == 0
    picked = fq.pick("p", "e1", now=4)
    assert picked is not None
    assert picked.job_id == second.job_id


@pytest.mark.usefixtures("tenant")
def test_kv_the_engine_holds_beyond_the_reservations_holds_picks_back(fq: FairQueue) -> None:
    fq.set_engine_policy(engine())
    teach(fq, [100] * 8)
    cost = FLOOR + 100 * TOKEN
    for _ in range(2):
        submit(fq, now=10)
    assert len(pick_all(fq, now=10)) == 2
    # The engine measures 90 % in use while its jobs reserve 2 x cost: the rest is growth
    # nobody counted, and picks count it on top of the reservations until the next reading.
    fq.set_engine_load("p", "e1", 0.0, kv_usage=0.9, preempted=0, now=10)
    excess = int(BUDGET * 0.9) - 2 * cost
    assert fq.reservation_reports("p", now=10)[0].excess_bytes == excess
    for _ in range(40):
        submit(fq, now=10)
    assert len(pick_all(fq, now=11)) == int(BUDGET * 0.1) // cost
    # A reading older than 30 s counts for nothing: the reservations alone hold room.
    assert fq.reservation_reports("p", now=41)[0].excess_bytes is None
    assert engine_reserved(fq) + len(pick_all(fq, now=41)) * cost == BUDGET // cost * cost


@pytest.mark.usefixtures("tenant")
def test_preemptions_scale_the_budget_down_and_quiet_readings_give_it_back(
    fq: FairQueue,
) -> None:
    fq.set_engine_policy(engine())
    teach(fq, [100] * 8)
    fq.set_engine_load("p", "e1", 0.0, kv_usage=0.0, preempted=2, now=10)
    fq.set_engine_load("p", "e1", 0.0, kv_usage=0.0, preempted=1, now=15)
    report = fq.reservation_reports("p", now=15)[0]
    assert report.scale == pytest.approx(0.64)
    for _ in range(40):
        submit(fq, now=15)
    cost = FLOOR + 100 * TOKEN
    assert len(pick_all(fq, now=16)) == int(BUDGET * 0.64) // cost
    for at in range(20, 100, 5):
        fq.set_engine_load("p", "e1", 0.0, kv_usage=0.0, preempted=0, now=at)
    assert fq.reservation_reports("p", now=100)[0].scale == 1.0
    assert len(pick_all(fq, now=100)) == BUDGET // cost - int(BUDGET * 0.64) // cost


def test_the_worst_case_mode_ignores_the_water_level(fq: FairQueue) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, PLENTY))
    fq.set_engine_policy(engine("worst"))
    fq.set_engine_load("p", "e1", 0.0, kv_usage=0.99, preempted=5, now=0)
    for _ in range(5):
        submit(fq)
    assert len(pick_all(fq)) == 4
    report = fq.reservation_reports("p", now=1)[0]
    assert (report.mode, report.scale, report.free_bytes) == ("worst", 1.0, 0)


def test_an_engine_policy_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="reservation mode"):
        replace(engine(), reservation="optimistic")


def test_a_tenant_whose_jobs_grow_past_its_quota_is_picked_nothing_until_back_under(
    fq: FairQueue,
) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, PLENTY))
    fq.set_engine_policy(engine())
    teach(fq, [50] * 8)
    cost = FLOOR + 50 * TOKEN
    fq.set_tenant_policy("a", TenantPolicy(1, 2 * cost + 10 * TOKEN))
    first, second, third = submit(fq), submit(fq), submit(fq)
    picked = pick_all(fq)
    assert [job.job_id for job in picked] == [first.job_id, second.job_id]
    assert fq.grow(first.pool, first.job_id, picked[0].attempt, 60, now=2) == 120
    # Its quota shows what its jobs hold, growth and all: past the quota by that growth.
    assert tenant_reserved(fq) == 2 * cost + 70 * TOKEN
    assert fq.pick("p", "e1", now=3) is None
    fq.release(first.pool, first.job_id, 90, 60, now=4)  # the prediction is 60 now: 10 more a job
    job = fq.pick("p", "e1", now=5)
    assert job is not None
    assert job.job_id == third.job_id
    assert fq.check().ok


@pytest.mark.usefixtures("tenant")
@pytest.mark.parametrize(("mode", "charged"), [("predict", 90 + 2 * 100), ("worst", 90 + 2000)])
def test_a_pick_charges_the_output_it_reserves_for(fq: FairQueue, mode: str, charged: int) -> None:
    fq.set_engine_policy(engine(mode))
    teach(fq, [100] * 8)
    submit(fq)
    job = fq.pick("p", "e1", now=1)
    assert job is not None
    # The tenant's counter carries the expected tokens until the release charges the real.
    assert job.charged == charged

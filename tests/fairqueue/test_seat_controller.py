"""The seat controllers' rules (lua/lib.lua `observe_ttft`, `seats_below`, `class_limit`)
against their pure statement (fairqueue/model.py `SeatController`, `class_limit`), and what a
bound does to picks, on the real Redis."""

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairqueue import EnginePolicy, FairQueue, Job, LastWords, TenantPolicy
from fairqueue.domain import ControllerSettings
from fairqueue.model import SeatController, class_limit

UNIT = 1024
SEATS, QUEUED = 4, 2
TARGET_S = 0.5


def engine(**bounds: object) -> EnginePolicy:
    return EnginePolicy(
        "e", "p", 10**9, SEATS, 0.4, 0.0, queued=QUEUED,
        seat_controller=ControllerSettings(quantile=0.9, step=1.0, idle_s=30.0),
        **bounds,  # type: ignore[arg-type]
    )  # fmt: skip


def setup(fq: FairQueue, **bounds: object) -> None:
    fq.set_tenant_policy("a", TenantPolicy(1, 10**9))
    fq.set_tenant_policy("b", TenantPolicy(1, 10**9))
    fq.set_engine_policy(engine(**bounds))


def submit(fq: FairQueue, request_class: str, now: float, tenant: str = "a") -> Job:
    return fq.enqueue(
        tenant=tenant, pool="p", request_class=request_class, prompt_tokens=10, max_tokens=10,
        kv_bytes=UNIT, now=now,
    )  # fmt: skip


def run(fq: FairQueue, enqueued: float, picked: float, released: float, ttft: float) -> None:
    """One interactive job: queued, picked, released with its time to first token."""
    submit(fq, "interactive", enqueued)
    job = fq.pick("p", "e", now=picked)
    assert job is not None
    assert job.request_class == "interactive"
    fq.release(job.pool, job.job_id, 10, 10, last_words=LastWords(ttft_s=ttft), now=released)


def below(fq_redis: redis.Redis) -> float | None:
    value = fq_redis.hget("gs:fq:{p:p}:engine:e", "below:interactive")
    return None if value is None else float(value)


observations = st.lists(
    st.tuples(
        st.floats(0.0, 4.0),  # time to first token, s
        st.floats(0.0, 3.0),  # pick after the previous release, s
        st.floats(0.0, 2.0),  # release after the pick, s
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(observations)
def test_the_scripts_move_the_bound_as_the_pure_controller_does(
    fq: FairQueue, fq_redis: redis.Redis, steps: list[tuple[float, float, float]]
) -> None:
    fq_redis.flushdb()
    setup(fq, ttft_targets_s={"interactive": TARGET_S})
    model = SeatController(TARGET_S, SEATS + QUEUED, SEATS, quantile=0.9, step=1.0, idle_s=30.0)
    now = 1.0
    for ttft, wait, run_s in steps:
        picked, released = now + wait, now + wait + run_s
        run(fq, now, picked, released, ttft)
        model.observe(ttft, picked, released)
        assert below(fq_redis) == pytest.approx(model.below, rel=1e-12)
        now = released
    reports = fq.seat_reports(now=now)
    assert reports[0].bounds[0].bound == model.bound(now)


def test_a_miss_cuts_by_how_far_over_and_hits_grow_slowly(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    setup(fq, ttft_targets_s={"interactive": TARGET_S})
    run(fq, 0, 0.1, 0.2, ttft=0.1)  # a hit from all seats: the bound stays at all of them
    assert below(fq_redis) == SEATS + QUEUED
    # 1.5 times the target: down to the engine's 4 seats (above them the bound limits only
    # its queue), then 1.5 x 0.9 seats off.
    run(fq, 1, 1.1, 1.2, ttft=0.75)
    assert below(fq_redis) == pytest.approx(4 - 1.35)
    run(fq, 2, 2.1, 2.2, ttft=2.0)  # 4 times over: 3.6 seats off, but never under 1
    assert below(fq_redis) == 1.0
    run(fq, 3, 3.1, 3.2, ttft=0.1)  # a hit: step x (1 - q)
    assert below(fq_redis) == pytest.approx(1.1)
    for second in range(4, 10):
        run(fq, second, second + 0.1, second + 0.2, ttft=0.1)
    assert below(fq_redis) == pytest.approx(1.7)  # hits grow it slowly


def test_misses_of_jobs_picked_before_the_last_cut_count_once(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    """A job picked under the old bound and measured after the cut says nothing new of it:
    it takes off one step, not as many as it was times over the target."""
    setup(fq, ttft_targets_s={"interactive": TARGET_S})
    jobs = []
    for _ in range(2):
        submit(fq, "interactive", 0)
        job = fq.pick("p", "e", now=0.1)
        assert job is not None
        jobs.append(job)
    fq.release(jobs[0].pool, jobs[0].job_id, 1, 1, last_words=LastWords(ttft_s=1.0), now=1.0)
    after_cut = below(fq_redis)
    assert after_cut is not None
    assert after_cut == pytest.approx(4 - 2 * 0.9)
    fq.release(jobs[1].pool, jobs[1].job_id, 1, 1, last_words=LastWords(ttft_s=1.0), now=1.5)
    assert below(fq_redis) == pytest.approx(after_cut - 0.9)  # not 2 x 0.9


def test_a_bound_keeps_the_lower_classes_out_of_its_seats_and_lapses_when_idle(
    fq: FairQueue,
) -> None:
    setup(fq, ttft_targets_s={"interactive": TARGET_S})
    for second in range(3):  # misses: the bound falls to one seat
        run(fq, second, second + 0.1, second + 0.2, ttft=4 * TARGET_S)
    assert fq.seat_reports(now=3)[0].bounds[0].bound == 1
    for _ in range(3):
        submit(fq, "standard", 3, tenant="b")
        submit(fq, "interactive", 3)
    picked = [fq.pick("p", "e", now=3.1) for _ in range(6)]
    classes = [job.request_class for job in picked if job is not None]
    assert classes.count("standard") == 1  # one seat below interactive, and it is taken
    assert classes.count("interactive") == 3
    report = fq.seat_reports(now=3.1)[0]
    assert report.limits == {"interactive": "", "standard": "interactive", "offline": "interactive"}
    # Interactive unmeasured past target_idle_s: nothing to protect, the bound lapses.
    later = fq.pick("p", "e", now=3.2 + 30.0)
    assert later is not None
    assert later.request_class == "standard"


def test_a_fixed_bound_holds_without_measures_and_a_new_target_starts_afresh(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    setup(fq, fixed_seats_below={"interactive": 2})
    for _ in range(4):
        submit(fq, "standard", 0, tenant="b")
    picked = [fq.pick("p", "e", now=1) for _ in range(4)]
    assert [job is not None for job in picked] == [True, True, False, False]
    assert fq.seat_reports(now=1)[0].limits["standard"] == "interactive"

    fq.set_engine_policy(engine(ttft_targets_s={"interactive": TARGET_S}))
    run(fq, 2, 2.1, 2.2, ttft=1.0)
    cut = below(fq_redis)
    assert cut is not None
    assert cut < SEATS + QUEUED
    fq.set_engine_policy(engine(ttft_targets_s={"interactive": TARGET_S}))  # unchanged: kept
    assert below(fq_redis) == cut
    fq.set_engine_policy(engine(ttft_targets_s={"interactive": 2 * TARGET_S}))  # changed
    assert below(fq_redis) is None
    assert fq_redis.hget("gs:fq:{p:p}:engine:e", "fixed:interactive") is None  # no longer set
    assert fq_redis.llen("gs:fq:{p:p}:engine:e:ttft:interactive") == 0


def test_the_pure_class_limit_names_the_bound_that_holds_a_class_back() -> None:
    held = {"interactive": 1, "standard": 2, "offline": 1}
    assert class_limit({"interactive": 3}, held, "standard") == "interactive"
    assert class_limit({"interactive": 4}, held, "standard") == ""
    assert class_limit({"standard": 1}, held, "offline") == "standard"
    assert class_limit({"interactive": 3, "standard": 1}, held, "interactive") == ""

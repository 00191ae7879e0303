"""The tick: each periodic job runs at its own interval, once per interval however many ticks
(or tickers) come, and one job's failure does not stop the others; a worker's ticker thread
ticks until it is stopped. On the real Redis; the jobs are stand-ins that record their runs
(the jobs themselves have their own tests)."""

from __future__ import annotations

import threading
import time

import redis
from django.conf import settings

from workers.periodic import (
    PeriodicJob,
    Ticker,
    claim_due,
    periodic_jobs,
    tick_interval_s,
)

TICK_S = 0.1


def recording(name: str, every_s: float, runs: list[str]) -> PeriodicJob:
    return PeriodicJob(name, every_s, lambda: runs.append(name))


def test_each_job_runs_at_its_own_interval(redis_db: redis.Redis):
    runs: list[str] = []
    jobs = [recording("often", 0.1, runs), recording("seldom", 0.4, runs)]
    ticker = Ticker(lambda: jobs, TICK_S, client=lambda: redis_db)
    ticker.start()
    time.sleep(0.95)  # ticks at 0, 0.1, ... 0.9 s
    ticker.stop(timeout_s=2.0)
    time.sleep(0.1)  # the last claimed runs end
    assert 8 <= runs.count("often") <= 10  # every tick (one may fall to a late tick)
    assert 2 <= runs.count("seldom") <= 3  # at 0, 0.4 and 0.8 s, not at every tick


def test_a_second_tick_at_the_same_moment_claims_nothing(redis_db: redis.Redis):
    jobs = [recording("a", 2.0, []), recording("b", 5.0, [])]
    assert claim_due(redis_db, jobs, 1.0) == ["a", "b"]
    assert claim_due(redis_db, jobs, 1.0) == []  # a duplicate tick, or a second beat


def test_a_failing_job_is_logged_and_the_others_still_run(redis_db: redis.Redis, caplog):
    runs: list[str] = []

    def broken() -> None:
        raise RuntimeError("the database is down")

    jobs = [recording("first", 1.0, runs), PeriodicJob("broken", 1.0, broken),
            recording("last", 1.0, runs)]  # fmt: skip
    ticker = Ticker(lambda: jobs, 1.0, client=lambda: redis_db)
    ticker.start()
    time.sleep(0.3)
    ticker.stop(timeout_s=2.0)
    assert sorted(runs) == ["first", "last"]
    assert "periodic job broken failed" in caplog.text


def test_the_ticker_ticks_in_its_own_thread_until_it_is_stopped(redis_db: redis.Redis):
    runs: list[str] = []
    ticker = Ticker(lambda: [recording("often", TICK_S, runs)], TICK_S, client=lambda: redis_db)
    ticker.start()
    time.sleep(0.55)
    ticker.stop(timeout_s=2.0)
    ran = len(runs)
    assert 4 <= ran <= 7  # at 0, 0.1, ... 0.5 s
    time.sleep(0.3)
    assert len(runs) == ran  # stopped: no tick after


def test_a_tick_that_fails_does_not_stop_the_ticker(redis_db: redis.Redis):
    calls: list[int] = []

    def jobs() -> list[PeriodicJob]:
        calls.append(1)
        if len(calls) == 1:
            raise redis.ConnectionError("Redis is restarting")
        return []

    ticker = Ticker(jobs, TICK_S, client=lambda: redis_db)
    ticker.start()
    time.sleep(0.35)
    ticker.stop(timeout_s=2.0)
    assert len(calls) >= 3


def test_a_slow_job_does_not_hold_the_others_back(redis_db: redis.Redis):
    """The sampler stuck on a saturated engine must not stop the scaler's turns."""
    runs: list[str] = []
    release = threading.Event()

    def stuck() -> None:
        runs.append("slow")
        release.wait(5)

    slow = PeriodicJob("slow", TICK_S, stuck)
    jobs = [slow, recording("quick", TICK_S, runs)]
    ticker = Ticker(lambda: jobs, TICK_S, client=lambda: redis_db)
    ticker.start()
    time.sleep(0.55)
    release.set()
    ticker.stop(timeout_s=2.0)
    assert runs.count("quick") >= 4  # on time while "slow" was stuck
    assert runs.count("slow") == 1  # not started again while its run was going


def test_the_ticker_comes_at_the_shortest_interval_and_carries_every_job():
    jobs = periodic_jobs()
    intervals = {job.name: job.every_s for job in jobs}
    assert tick_interval_s(jobs) == min(intervals.values())
    assert intervals == {
        "flush_usage": settings.GPUSHARE_USAGE_FLUSH_INTERVAL_S,
        "housekeeping": settings.GPUSHARE_HOUSEKEEPING_INTERVAL_S,
        "batch_tick": settings.GPUSHARE_BATCH_FEED_INTERVAL_S,
        "telemetry_sample": settings.GPUSHARE_TELEMETRY_INTERVAL_S,
        "scaler_tick": settings.GPUSHARE_SCALER_INTERVAL_S,
        "budgets_check": settings.GPUSHARE_BUDGET_CHECK_INTERVAL_S,
    }
    # What the ticker runs is not sent by beat as well (that would double its work).
    carried = {f"workers.{name}" for name in intervals}
    assert not carried & {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}


def test_a_job_is_claimed_only_when_its_own_interval_came_round_here(
    redis_db: redis.Redis, monkeypatch
):
    """Not every job at every tick: a job of 5 s is asked for once in five ticks of 1 s."""
    from workers import periodic

    asked: list[list[str]] = []

    def claim_recorded(client: redis.Redis, jobs: list[PeriodicJob], tick_s: float) -> list[str]:
        asked.append([job.name for job in jobs])
        return claim_due(client, jobs, tick_s)

    monkeypatch.setattr(periodic, "claim_due", claim_recorded)
    runs: list[str] = []
    jobs = [recording("often", 1.0, runs), recording("seldom", 5.0, runs)]
    ticker = Ticker(lambda: jobs, 1.0, client=lambda: redis_db)
    for second in range(6):
        ticker._tick(now=1000.0 + second)
        redis_db.delete("gs:tick:often")  # its claim would have expired by the next tick
        # A second passes between real ticks: the runs claimed here end before the next one
        # (on a loaded machine the pool's thread may not have run them yet).
        deadline = time.monotonic() + 5.0
        while ticker._running and time.monotonic() < deadline:
            time.sleep(0.01)
    assert asked == [["often", "seldom"], ["often"], ["often"], ["often"], ["often"],
                     ["often", "seldom"]]  # fmt: skip
    ticker.stop()

"""The scaler's rules as pure functions: metrics history, engines and the clock in, one
decision with its reason out. No database, no Redis."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pytest

from scheduler.pools.scaling import (
    Decision,
    EngineView,
    LastAction,
    Peak,
    PeakError,
    PoolPolicy,
    QueueSample,
    decide,
    floor_for,
    parse_peaks,
)

# A Wednesday.
NOW = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
TICK = 10


def policy(**overrides: object) -> PoolPolicy:
    values: dict[str, object] = {
        "hot_size": 1,
        "cold_max": 2,
        "target_wait_s": 5.0,
        "target_depth": 16,
        "sustain_s": 60,
        "quiet_period_s": 300,
        "peak_lead_s": 1200,
    }
    values.update(overrides)
    return PoolPolicy(**values)  # type: ignore[arg-type]


def engine(name: str, status: str = "ready", **kw: object) -> EngineView:
    return EngineView(name=name, status=status, max_num_seqs=16, **kw)  # type: ignore[arg-type]


def history(
    seconds: int, *, waiting: int = 0, oldest: float = 0.0, running: int = 0
) -> list[QueueSample]:
    """One sample per tick over the last `seconds`, all alike."""
    return [
        QueueSample(at=NOW - timedelta(seconds=s), waiting=waiting, oldest_wait_s=oldest,
                    running=running)
        for s in range(seconds, -1, -TICK)
    ]  # fmt: skip


def run(
    pol: PoolPolicy,
    engines: list[EngineView],
    samples: list[QueueSample],
    last: LastAction | None = None,
    now: datetime = NOW,
) -> Decision:
    return decide(policy=pol, engines=engines, samples=samples, now=now, last=last)


ONE_HOT_TWO_COLD = [engine("e1"), engine("e2", "stopped"), engine("e3", "stopped")]


def test_a_queue_over_its_wait_target_for_the_whole_window_starts_one_cold_engine():
    decision = run(policy(), ONE_HOT_TWO_COLD, history(70, waiting=3, oldest=9.0))
    assert decision.action == "start"
    assert decision.code == "sustained"
    assert decision.engines == ("e2",)
    assert "oldest 9.0 s" in decision.reason
    assert "60 s" in decision.reason


def test_a_queue_over_its_depth_target_for_the_whole_window_starts_one_too():
    decision = run(policy(), ONE_HOT_TWO_COLD, history(70, waiting=20, oldest=1.0))
    assert (decision.action, decision.engines) == ("start", ("e2",))


def test_a_single_spike_holds():
    samples = history(70)
    samples[-1] = QueueSample(at=NOW, waiting=50, oldest_wait_s=30.0, running=16)
    decision = run(policy(), ONE_HOT_TWO_COLD, samples)
    assert (decision.action, decision.code) == ("hold", "spike")


def test_pressure_shorter_than_the_window_holds_even_when_every_sample_is_over():
    for lasted in (30, 50):
        decision = run(policy(), ONE_HOT_TWO_COLD, history(lasted, waiting=20, oldest=9.0))
        assert (decision.action, decision.code) == ("hold", "spike")


def test_pressure_counts_only_after_the_last_start():
    last = LastAction("start", NOW - timedelta(seconds=30), pending=False)
    decision = run(policy(), ONE_HOT_TWO_COLD, history(120, waiting=20, oldest=9.0), last)
    assert (decision.action, decision.code) == ("hold", "spike")
    later = LastAction("start", NOW - timedelta(seconds=90), pending=False)
    decision = run(policy(), ONE_HOT_TWO_COLD, history(120, waiting=20, oldest=9.0), later)
    assert decision.action == "start"


def test_it_never_starts_above_hot_size_plus_cold_max():
    engines = [engine("e1"), engine("e2"), engine("e3"), engine("e4", "stopped")]
    decision = run(policy(), engines, history(70, waiting=20, oldest=9.0))
    assert (decision.action, decision.code) == ("hold", "at_max")
    assert "hot 1 + cold 2" in decision.reason


def test_it_starts_engines_to_reach_the_hot_size_whatever_the_queue():
    engines = [engine("e1", "stopped"), engine("e2", "stopped"), engine("e3", "failed")]
    decision = run(policy(hot_size=2), engines, [])
    assert decision.action == "start"
    assert decision.code == "floor"
    assert decision.engines == ("e1", "e2")


def test_a_failed_engine_is_started_only_when_no_stopped_one_is_left():
    engines = [engine("a", "failed"), engine("b", "stopped")]
    assert run(policy(hot_size=1), engines, []).engines == ("b",)
    assert run(policy(hot_size=1), [engine("a", "failed")], []).engines == ("a",)


def test_after_a_failed_start_it_waits_before_trying_again():
    last = LastAction("start", NOW - timedelta(seconds=20), pending=False, failed=True)
    decision = run(policy(), [engine("e1", "failed")], [], last)
    assert (decision.action, decision.code) == ("hold", "retry_wait")
    last = LastAction("start", NOW - timedelta(seconds=61), pending=False, failed=True)
    assert run(policy(), [engine("e1", "failed")], [], last).action == "start"


def test_without_a_registered_engine_to_start_it_holds_and_says_so():
    decision = run(policy(), [engine("e1")], history(70, waiting=20, oldest=9.0))
    assert (decision.action, decision.code) == ("hold", "no_engine_to_start")
    assert "pool add-engines" in decision.reason


def test_ahead_of_a_scheduled_peak_it_starts_the_peaks_extra_engines():
    lunch = Peak("lunch", (2,), time(10, 15), time(12, 0), extra=2)  # Wednesday 10:15
    decision = run(policy(peaks=(lunch,)), ONE_HOT_TWO_COLD, [])
    assert decision.action == "start"
    assert decision.code == "floor"
    assert decision.engines == ("e2", "e3")
    assert "scheduled peak 'lunch'" in decision.reason


def test_a_peak_further_away_than_the_lead_time_or_on_another_day_starts_nothing():
    later = Peak("evening", (2,), time(19, 0), time(21, 0), extra=1)
    other_day = Peak("monday", (0,), time(10, 0), time(11, 0), extra=1)
    decision = run(policy(peaks=(later, other_day)), ONE_HOT_TWO_COLD, history(300))
    assert decision.action == "hold"


def test_a_peak_past_midnight_still_holds_its_engines_after_midnight():
    night = Peak("night", (1,), time(22, 0), time(2, 0), extra=1)  # Tuesday 22:00-02:00
    at = datetime(2026, 11, 25, 1, 0, tzinfo=UTC)  # Wednesday 01:00
    assert floor_for(policy(peaks=(night,)), at)[0] == 2
    assert floor_for(policy(peaks=(night,)), at.replace(hour=3))[0] == 1


def test_peak_times_are_in_the_pools_time_zone():
    lunch = Peak("lunch", (2,), time(12, 0), time(13, 0), extra=1)
    # 10:00 UTC is 11:00 in Berlin (winter): within the 20 minute lead? No: 60 min ahead.
    assert floor_for(policy(peaks=(lunch,), timezone="Europe/Berlin"), NOW)[0] == 1
    # 10:45 UTC = 11:45 Berlin: 15 minutes ahead of the peak.
    at = NOW + timedelta(minutes=45)
    assert floor_for(policy(peaks=(lunch,), timezone="Europe/Berlin"), at)[0] == 2


def test_a_peak_never_raises_the_floor_above_hot_size_plus_cold_max():
    huge = Peak("huge", tuple(range(7)), time(9, 0), time(11, 0), extra=10)
    assert floor_for(policy(peaks=(huge,)), NOW)[0] == 3


def test_quiet_for_the_whole_period_drains_one_cold_engine():
    started = NOW - timedelta(hours=1)
    engines = [
        engine("e1", started_at=started - timedelta(hours=5)),
        engine("e2", started_at=started),
        engine("e3", "stopped"),
    ]
    decision = run(policy(), engines, history(310, running=2))
    assert decision.action == "drain"
    assert decision.code == "quiet"
    assert decision.engines == ("e2",)  # the most recently started of the idle ones


def test_the_engine_drained_is_the_one_with_fewest_jobs_in_flight():
    engines = [engine("e1", in_flight=0), engine("e2", in_flight=3)]
    decision = run(policy(), engines, history(310, running=3))
    assert decision.engines == ("e1",)


def test_a_quiet_period_cut_short_holds():
    engines = [engine("e1"), engine("e2")]
    assert run(policy(), engines, history(200)).action == "hold"
    samples = history(310)
    samples[5] = QueueSample(at=samples[5].at, waiting=1, oldest_wait_s=0.2, running=1)
    assert run(policy(), engines, samples).action == "hold"


def test_quiet_counts_only_after_the_last_start():
    engines = [engine("e1"), engine("e2")]
    last = LastAction("start", NOW - timedelta(seconds=100), pending=False)
    assert run(policy(), engines, history(600), last).action == "hold"


def test_a_busy_pool_without_a_queue_is_not_quiet():
    # 20 running would fill the remaining engine (16 slots) more than half.
    engines = [engine("e1"), engine("e2")]
    assert run(policy(), engines, history(310, running=20)).action == "hold"


def test_with_a_hot_size_of_zero_the_last_engine_drains_only_when_nothing_ran():
    engines = [engine("e1")]
    assert run(policy(hot_size=0), engines, history(310, running=1)).action == "hold"
    decision = run(policy(hot_size=0), engines, history(310))
    assert (decision.action, decision.engines) == ("drain", ("e1",))


def test_it_never_drains_below_the_hot_size():
    engines = [engine("e1"), engine("e2"), engine("e3", "stopped")]
    decision = run(policy(hot_size=2), engines, history(600))
    assert (decision.action, decision.code) == ("hold", "steady")


def test_it_never_drains_below_a_scheduled_peaks_floor():
    lunch = Peak("lunch", (2,), time(9, 0), time(12, 0), extra=1)
    engines = [engine("e1"), engine("e2")]
    assert run(policy(peaks=(lunch,)), engines, history(600)).action == "hold"


@pytest.mark.parametrize("moving", ["starting", "warming", "draining"])
def test_while_an_engine_of_the_pool_moves_nothing_else_is_decided(moving):
    engines = [engine("e1"), engine("e2", moving), engine("e3", "stopped")]
    decision = run(policy(), engines, history(400, waiting=40, oldest=60.0))
    assert (decision.action, decision.code) == ("hold", "in_progress")
    assert f"e2 {moving}" in decision.reason


def test_while_the_last_decision_is_carried_out_nothing_else_is_decided():
    last = LastAction("start", NOW - timedelta(seconds=5), pending=True)
    decision = run(policy(hot_size=3), ONE_HOT_TWO_COLD, [], last)
    assert (decision.action, decision.code) == ("hold", "in_progress")


def test_a_decision_starts_at_most_what_the_floor_asks_and_one_on_pressure():
    decision = run(policy(cold_max=5), ONE_HOT_TWO_COLD, history(70, waiting=99, oldest=99.0))
    assert len(decision.engines) == 1


def test_peaks_parse_from_the_pools_json_and_bad_ones_are_refused():
    peaks = parse_peaks([{"name": "lunch", "days": [0, 4], "start": "11:30", "end": "13:30",
                          "extra": 2}])  # fmt: skip
    assert peaks == [Peak("lunch", (0, 4), time(11, 30), time(13, 30), 2)]
    assert parse_peaks([{"start": "08:00", "end": "09:00"}])[0].days == tuple(range(7))
    bad_peaks: list[dict[str, object]] = [
        {"start": "8 o'clock", "end": "09:00"},
        {"start": "08:00"},
        {"start": "08:00", "end": "09:00", "days": [7]},
        {"start": "08:00", "end": "09:00", "extra": 0},
    ]
    for bad in bad_peaks:
        with pytest.raises(PeakError):
            parse_peaks([bad])

"""Change marks (plumbing/change_marks.py) with the real Redis: a periodic job acts when a save
counted since its last pass, when its memory of that pass expired, or when Redis lost both;
and only then."""

from __future__ import annotations

import time

import pytest
import redis

from plumbing.change_marks import ChangeMark, cache_by_marks, counts
from plumbing.ttlcache import TtlCache

pytestmark = pytest.mark.django_db


def acted(mark: ChangeMark) -> bool:
    """One pass of a job guarded by the mark: True when it acted."""
    return mark.run_if_moved(lambda: True) is not None


def test_a_job_acts_once_then_waits_for_a_change(redis_db: redis.Redis) -> None:
    mark = ChangeMark("things", recheck_s=30)
    assert acted(mark)  # never acted before
    assert not acted(mark)
    assert not acted(mark)


def test_a_save_counts_only_once_its_transaction_commits(
    redis_db: redis.Redis, django_capture_on_commit_callbacks
) -> None:
    mark = ChangeMark("things", recheck_s=30)
    assert acted(mark)
    with django_capture_on_commit_callbacks() as committed:
        mark.bump()
        # A pass now would read the rows as they were before the save.
        assert not acted(mark)
    for callback in committed:
        callback()
    assert acted(mark)
    assert not acted(mark)


def test_a_change_counted_during_a_pass_brings_another_pass(
    redis_db: redis.Redis, django_capture_on_commit_callbacks
) -> None:
    mark = ChangeMark("things", recheck_s=30)
    count = mark.moved()
    assert count is not None
    with django_capture_on_commit_callbacks(execute=True):
        mark.bump()  # saved while the job was reading
    mark.acted_on(count)
    assert acted(mark)


def test_the_job_acts_again_after_recheck_s_whatever_happened(redis_db: redis.Redis) -> None:
    mark = ChangeMark("things", recheck_s=0.2)
    assert acted(mark)
    assert not acted(mark)
    time.sleep(0.3)
    assert acted(mark)


def test_a_redis_that_lost_its_data_makes_the_job_act(redis_db: redis.Redis) -> None:
    mark = ChangeMark("things", recheck_s=30)
    assert acted(mark)
    redis_db.flushdb()
    assert acted(mark)


def test_marks_of_different_names_do_not_mix(
    redis_db: redis.Redis, django_capture_on_commit_callbacks
) -> None:
    engines, batches = ChangeMark("engines", recheck_s=30), ChangeMark("batches", recheck_s=30)
    assert acted(engines)
    assert acted(batches)
    with django_capture_on_commit_callbacks(execute=True):
        engines.bump()
    assert not acted(batches)
    assert acted(engines)


def test_a_pass_that_is_not_settled_runs_again_without_a_change(redis_db: redis.Redis) -> None:
    mark = ChangeMark("things", recheck_s=30)
    assert mark.run_if_moved(lambda: 2, settled=lambda left: left == 0) == 2
    assert mark.run_if_moved(lambda: 0, settled=lambda left: left == 0) == 0
    assert mark.run_if_moved(lambda: 0, settled=lambda left: left == 0) is None


def test_the_count_moves_with_each_committed_save(
    redis_db: redis.Redis, django_capture_on_commit_callbacks
) -> None:
    mark = ChangeMark("things", recheck_s=30)
    assert counts([mark])[0] == "0"
    with django_capture_on_commit_callbacks(execute=True):
        mark.bump()
        assert counts([mark])[0] == "0"  # not before the commit
    assert counts([mark])[0] == "1"


def test_a_cache_by_two_marks_reads_again_when_either_moved(redis_db: redis.Redis) -> None:
    """An entry that ran out is computed again only after a save counted by one of its marks
    (or the marks' recheck); both counts are read in one round trip."""
    things = ChangeMark("things", recheck_s=30, client=lambda: redis_db)
    others = ChangeMark("others", recheck_s=20, client=lambda: redis_db)
    cache: TtlCache[int] = cache_by_marks(0.01, lambda: things, lambda: others)
    assert cache.max_age_s == 20  # the sooner recheck of the two
    computed = 0

    def compute() -> int:
        nonlocal computed
        computed += 1
        return computed

    def read() -> int:
        time.sleep(0.02)  # the entry has run out
        return cache.get_or_compute("row", compute)

    assert read() == 1
    assert read() == 1  # ran out, no mark moved: kept
    for mark, expected in ((things, 2), (others, 3)):
        mark._incr()  # a committed save
        assert read() == expected
    assert counts([things, others]) == ("1", "1")

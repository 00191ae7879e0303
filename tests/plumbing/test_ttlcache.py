"""The per-process TTL cache: an entry that ran out is refreshed by one thread while the others
keep the old value for that moment, instead of every thread asking the database at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from django.core.exceptions import SynchronousOnlyOperation

from plumbing import ttlcache
from plumbing.ttlcache import TtlCache


def test_one_thread_refreshes_a_stale_entry_while_the_others_use_the_old_value():
    cache: TtlCache[str] = TtlCache(ttl_s=0.01)
    assert cache.get_or_compute("k", lambda: "old") == "old"
    time.sleep(0.02)  # run out
    computing, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow() -> str:
        calls.append("slow")
        computing.set()
        release.wait(5)
        return "new"

    refresher = threading.Thread(target=lambda: cache.get_or_compute("k", slow))
    refresher.start()
    assert computing.wait(5)
    # Meanwhile: the old value at once, and no second computation.
    assert [cache.get_or_compute("k", lambda: "other") for _ in range(3)] == ["old"] * 3
    release.set()
    refresher.join(5)
    assert calls == ["slow"]
    assert cache.get_or_compute("k", lambda: "other") == "new"


def test_a_refresh_that_fails_leaves_the_next_caller_to_try_again():
    cache: TtlCache[str] = TtlCache(ttl_s=0.01)
    cache.get_or_compute("k", lambda: "old")
    time.sleep(0.02)

    def broken() -> str:
        raise RuntimeError("the database is down")

    with pytest.raises(RuntimeError):
        cache.get_or_compute("k", broken)
    assert cache.get_or_compute("k", lambda: "new") == "new"


def test_on_an_event_loop_an_entry_is_not_computed_and_a_thread_then_computes_it(monkeypatch):
    """The web's loop refuses before the compute starts (it would build a query for nothing);
    the thread it hands the step to computes the entry, which the loop then uses."""
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    cache: TtlCache[str] = TtlCache(ttl_s=60)
    calls: list[str] = []

    def compute() -> str:
        calls.append("computed")
        return "value"

    async def on_the_loop() -> str:
        return cache.get_or_compute("k", compute)

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(on_the_loop())
    assert calls == []
    computed: list[str] = []
    thread = threading.Thread(target=lambda: computed.append(cache.get_or_compute("k", compute)))
    thread.start()
    thread.join(5)
    assert computed == ["value"]  # the refused attempt did not leave the key "refreshing"
    assert asyncio.run(on_the_loop()) == "value"
    assert calls == ["computed"]


class Version:
    """A version read that tests move by hand, counting how often it is read."""

    def __init__(self) -> None:
        self.value, self.reads, self.broken = 0, 0, False

    def __call__(self) -> int:
        self.reads += 1
        if self.broken:
            raise ConnectionError("Redis is away")
        return self.value


class Clock:
    """The cache's monotonic clock, moved by hand: a stalled test machine cannot make an
    entry run out early."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(ttlcache, "time", fake)
    return fake


def counting(value: str, calls: list[str]) -> Callable[[], str]:
    def compute() -> str:
        calls.append(value)
        return value

    return compute


def test_an_entry_that_ran_out_is_kept_while_its_version_is_unchanged(clock: Clock):
    version, calls = Version(), list[str]()
    cache: TtlCache[str] = TtlCache(ttl_s=2, version=version)
    assert cache.get_or_compute("k", counting("v1", calls)) == "v1"
    for _ in range(3):
        clock.now += 3  # run out, again and again
        assert cache.get_or_compute("k", counting("v2", calls)) == "v1"
    assert calls == ["v1"]
    assert version.reads == 4  # at the first computation, then once each time it ran out
    clock.now += 1
    assert cache.get_or_compute("k", counting("v2", calls)) == "v1"  # fresh: no read at all
    assert version.reads == 4


def test_a_moved_version_computes_the_entry_again_once_it_runs_out(clock: Clock):
    version, calls = Version(), list[str]()
    cache: TtlCache[str] = TtlCache(ttl_s=2, version=version)
    cache.get_or_compute("k", counting("v1", calls))
    version.value += 1
    clock.now += 1
    assert cache.get_or_compute("k", counting("v2", calls)) == "v1"  # still fresh
    clock.now += 2
    assert cache.get_or_compute("k", counting("v2", calls)) == "v2"
    clock.now += 3
    assert cache.get_or_compute("k", counting("v3", calls)) == "v2"  # unchanged since
    assert calls == ["v1", "v2"]


def test_an_entry_is_computed_again_past_its_max_age_whatever_the_version(clock: Clock):
    version, calls = Version(), list[str]()
    cache: TtlCache[str] = TtlCache(ttl_s=2, version=version, max_age_s=10)
    cache.get_or_compute("k", counting("v1", calls))
    clock.now += 3
    assert cache.get_or_compute("k", counting("v2", calls)) == "v1"
    clock.now += 8  # 11 s after it was computed
    assert cache.get_or_compute("k", counting("v2", calls)) == "v2"


def test_on_an_event_loop_an_entry_that_ran_out_is_refreshed_by_a_thread_not_the_loop(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    """Its version is a Redis read: the loop reads neither it nor the database. It raises
    before either, a thread refreshes the entry, and the loop uses it while it is fresh."""
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    version, calls = Version(), list[str]()
    cache: TtlCache[str] = TtlCache(ttl_s=2, version=version)

    async def on_the_loop() -> str:
        return cache.get_or_compute("k", counting("v2", calls))

    with pytest.raises(SynchronousOnlyOperation):  # not cached yet
        asyncio.run(on_the_loop())
    assert version.reads == 0
    cache.get_or_compute("k", counting("v1", calls))  # the thread
    assert asyncio.run(on_the_loop()) == "v1"
    clock.now += 3  # run out
    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(on_the_loop())
    assert version.reads == 1  # the thread's, at the first computation
    assert cache.get_or_compute("k", counting("v2", calls)) == "v1"  # the thread: unchanged
    assert version.reads == 2
    assert asyncio.run(on_the_loop()) == "v1"  # fresh again
    assert calls == ["v1"]


def test_on_an_event_loop_an_entry_a_thread_is_refreshing_is_used_as_it_was(clock: Clock):
    version = Version()
    cache: TtlCache[str] = TtlCache(ttl_s=2, version=version)
    cache.get_or_compute("k", lambda: "old")
    clock.now += 3
    computing, release = threading.Event(), threading.Event()

    def slow() -> str:
        computing.set()
        release.wait(5)
        return "new"

    version.value += 1  # the thread computes again
    refresher = threading.Thread(target=lambda: cache.get_or_compute("k", slow))
    refresher.start()
    assert computing.wait(5)

    async def on_the_loop() -> str:
        return cache.get_or_compute("k", lambda: "other")

    try:
        assert asyncio.run(on_the_loop()) == "old"
    finally:
        release.set()
        refresher.join(5)
    assert asyncio.run(on_the_loop()) == "new"


def test_a_version_that_cannot_be_read_counts_as_changed(clock: Clock):
    version, calls = Version(), list[str]()
    cache: TtlCache[str] = TtlCache(ttl_s=2, version=version)
    cache.get_or_compute("k", counting("v1", calls))
    version.broken = True
    clock.now += 3
    assert cache.get_or_compute("k", counting("v2", calls)) == "v2"
    version.broken = False
    clock.now += 3  # the entry computed without a version is computed again
    assert cache.get_or_compute("k", counting("v3", calls)) == "v3"
    assert calls == ["v1", "v2", "v3"]

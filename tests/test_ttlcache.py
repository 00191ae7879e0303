"""The per-process TTL cache: an entry that ran out is refreshed by one thread while the others
keep the old value for that moment, instead of every thread asking the database at once."""

from __future__ import annotations

import threading
import time

import pytest

from config.ttlcache import TtlCache


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

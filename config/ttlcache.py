"""A small per-process cache whose entries live a few seconds.

For the request path's reads that change rarely (an API key's tenant, a model's route): a
few seconds of staleness is the price of not asking the database on every request. Each use
says what that staleness means for it.

An entry that has just run out is refreshed by one thread while the others keep using the
old value for the moment that takes: under load, every thread of a pool used to find the
entry gone at the same instant and ask the database the same question at once (measured in
the worker: the engine lookup of every running job, each time the entry ran out).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class TtlCache(Generic[V]):
    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._refreshing: set[Hashable] = set()  # keys a thread is computing again
        self._lock = threading.Lock()

    def get_or_compute(self, key: Hashable, compute: Callable[[], V]) -> V:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
            if hit is not None and key in self._refreshing:
                return hit[1]  # another thread is refreshing it: the old value meanwhile
            self._refreshing.add(key)
        try:
            value = compute()
        finally:
            with self._lock:
                self._refreshing.discard(key)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # crude, but bounded; a full cache is rare and cheap
            self._entries[key] = (now + self.ttl_s, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

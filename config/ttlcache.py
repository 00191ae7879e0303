"""A small per-process cache whose entries live a few seconds.

For the request path's reads that change rarely (an API key's tenant, a model's route): a
few seconds of staleness is the price of not asking the database on every request. Each use
says what that staleness means for it.

An entry that has just run out is refreshed by one thread while the others keep using the
old value for the moment that takes: under load, every thread of a pool used to find the
entry gone at the same instant and ask the database the same question at once (measured in
the worker: the engine lookup of every running job, each time the entry ran out).

Every compute reads the database, so none starts on a thread that runs an event loop (the
web's): Django would refuse it there too, but only after the ORM had built and compiled the
query. The caller redoes the step in a thread (scheduler.online.admit), which refreshes the
entry; the loop uses fresh entries, and checks a version, on its own.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, NamedTuple, TypeVar

from django.utils.asyncio import async_unsafe

V = TypeVar("V")

# The version of an entry whose version could not be read (or of a cache without one): it
# equals no version, so the entry is computed again when it runs out.
_UNKNOWN = object()

# Django's own rule (and its DJANGO_ALLOW_ASYNC_UNSAFE), applied before the compute starts.
# Under load the web built and compiled the key lookup's query on its loop for nothing, for
# every request that came while an entry waited for its refresh: a fifth of the web's CPU
# (py-spy, bench/online_overhead.py; docs/BENCHMARKS.md, 2026-12-03, fourth session).
_not_on_a_loop = async_unsafe("A cache entry is computed from the database, not on an event loop.")


class _Entry(NamedTuple, Generic[V]):
    expires: float
    value: V
    version: object
    computed_at: float


class TtlCache(Generic[V]):
    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 10_000,
        *,
        version: Callable[[], Hashable] | None = None,
        max_age_s: float = math.inf,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self._version = version
        self._entries: dict[Hashable, _Entry[V]] = {}
        self._refreshing: set[Hashable] = set()  # keys a thread is computing again
        self._lock = threading.Lock()

    def get_or_compute(self, key: Hashable, compute: Callable[[], V]) -> V:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit.expires > now:
                return hit.value
            if hit is not None and key in self._refreshing:
                return hit.value  # another thread is refreshing it: the old value meanwhile
            self._refreshing.add(key)
        try:
            version = self._current_version()  # before computing: a change meanwhile shows
            if hit is not None and self._still_valid(hit, version, now):
                value, computed_at = hit.value, hit.computed_at
            else:
                value, computed_at = _not_on_a_loop(compute)(), now
        finally:
            with self._lock:
                self._refreshing.discard(key)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # crude, but bounded; a full cache is rare and cheap
            self._entries[key] = _Entry(now + self.ttl_s, value, version, computed_at)
        return value

    def _still_valid(self, hit: _Entry[V], version: object, now: float) -> bool:
        known = version is not _UNKNOWN
        return known and version == hit.version and now < hit.computed_at + self.max_age_s

    def _current_version(self) -> object:
        if self._version is None:
            return _UNKNOWN
        try:
            return self._version()
        except Exception:  # Redis away: compute again, as without a version
            return _UNKNOWN

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

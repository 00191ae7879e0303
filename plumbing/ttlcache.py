"""A small per-process cache whose entries live a few seconds.

For the request path's reads that change rarely (an API key's tenant, a model's route): a
few seconds of staleness is the price of not asking the database on every request. Each use
says what that staleness means for it.

An entry that has just run out is refreshed by one thread while the others keep using the
old value for the moment that takes: under load, every thread of a pool would otherwise find
the entry gone at the same instant and ask the database the same question at once (in the
worker: the engine lookup of every running job, each time the entry runs out;
docs/decisions/0008-the-request-path-spends-cpu-once.md).

A refresh reads the entry's version (Redis) and, when need be, computes it again (the
database): both block their thread, so no refresh starts on a thread that runs an event loop
(the web's). There an entry that is fresh, or that another thread is refreshing, is used;
anything else raises Django's SynchronousOnlyOperation before anything is read, and the caller
redoes the step in a thread (scheduler.online.admission), which refreshes the entry for the
loop's next use. (Django refuses the compute's query on a loop too, but only once the ORM has
built and compiled it; the version read it does not refuse at all.)
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


@async_unsafe("A cache entry is refreshed from Redis and the database, not on an event loop.")
def _refuse_on_a_loop() -> None:
    """Django's own rule (and its DJANGO_ALLOW_ASYNC_UNSAFE), applied before a refresh starts:
    the version read is a Redis round trip that Django does not guard, and a compute started
    on the loop builds and compiles its query before Django refuses it, for every request
    that comes while an entry waits for its refresh: a large share of the web's CPU under
    load (docs/decisions/0008-the-request-path-spends-cpu-once.md)."""


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
            _refuse_on_a_loop()  # nothing read, and the key not marked as refreshing
            self._refreshing.add(key)
        try:
            version = self._current_version()  # before computing: a change meanwhile shows
            if hit is not None and self._still_valid(hit, version, now):
                value, computed_at = hit.value, hit.computed_at
            else:
                value, computed_at = compute(), now
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

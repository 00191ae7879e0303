"""Change marks: a periodic job skips its database reads while the rows it reads are unchanged.

Housekeeping copies the engines' rows to the fair queue every 2 s and the batch feeder looks
for active batches every 2 s. On a platform whose engines and batches sit still, both would
read the same rows again and again, and an ORM query costs about 1 ms of CPU: more, spread
over the requests of a second, than a request's own share of the worker
(docs/decisions/0007-periodic-work-on-each-workers-ticker.md).

A mark is a counter in Redis that each save of those rows bumps once its transaction commits.
Every mark's keys carry one Redis Cluster hash tag, `{changes}`, so the reads of several keys
at once (`moved`, `counts`) are of one slot.
The job keeps in Redis the count it last acted on, and acts again only when the count moved,
or when that memory expired: every `recheck_s` a pass runs whatever happened, so a change made
around the ORM's signals (a queryset.update(), a bump lost while Redis was away) is still seen
within that time. A Redis that lost its data lost both keys, and the job acts.

The same counts version the per-process caches of those rows (`cache_by_marks`): an entry
that runs out is read again from the database only when a mark moved since it was computed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import redis
from django.db import transaction

from plumbing.redis import redis_client
from plumbing.ttlcache import TtlCache

log = logging.getLogger(__name__)

PREFIX = "gs:changes:{changes}:"

_T = TypeVar("_T")
_V = TypeVar("_V")


class ChangeMark:
    def __init__(
        self,
        name: str,
        *,
        recheck_s: float,
        client: Callable[[], redis.Redis] = redis_client,
    ) -> None:
        self.name, self.recheck_s, self._client = name, recheck_s, client
        self._count_key = f"{PREFIX}{name}:count"
        self._seen_key = f"{PREFIX}{name}:seen"

    def bump(self) -> None:
        """Counts a change, once the current transaction (if any) commits: a job that saw the
        count move before the commit would read the old rows and take them as current."""
        transaction.on_commit(self._incr)

    def _incr(self) -> None:
        try:
            self._client().incr(self._count_key)
        except redis.RedisError:  # the recheck sees the change within recheck_s
            log.warning("could not mark a change of %s", self.name, exc_info=True)

    def moved(self) -> str | None:
        """The count to hand to `acted_on` when the job must act; None while nothing changed
        since it last acted."""
        count, seen = self._client().mget(self._count_key, self._seen_key)
        current = str(count or "0")  # the client decodes: str, or None before any change
        return None if seen == current else current

    def acted_on(self, count: str) -> None:
        """The job has read the rows as they were at `count`. A change counted meanwhile
        moved the count past it, so the next `moved` asks for another pass."""
        self._client().set(self._seen_key, count, px=max(1, int(self.recheck_s * 1000)))

    def run_if_moved(
        self, job: Callable[[], _T], *, settled: Callable[[_T], bool] = lambda _: True
    ) -> _T | None:
        """`job()` when the count moved (or the recheck is due), else None. The pass counts
        as acted on when `settled(result)`: a job that still has work (active batches) runs
        again next time whatever the count says."""
        count = self.moved()
        if count is None:
            return None
        result = job()
        if settled(result):
            self.acted_on(count)
        return result


def counts(marks: Sequence[ChangeMark]) -> tuple[str, ...]:
    """The marks' counts in one round trip (they share the first mark's Redis)."""
    current = marks[0]._client().mget([mark._count_key for mark in marks])
    return tuple(str(count or "0") for count in current)


def cache_by_marks(ttl_s: float, *marks: Callable[[], ChangeMark]) -> TtlCache[_V]:
    """A per-process cache of rows the marks count saves of: an entry that runs out after
    `ttl_s` is read again only when one of the marks moved since (one Redis read), or when
    the soonest of the marks' rechecks came round whatever happened (read once, here). The
    marks are made again at each read, so that tests' settings reach their Redis."""
    return TtlCache(
        ttl_s,
        version=lambda: counts([mark() for mark in marks]),
        max_age_s=min(mark().recheck_s for mark in marks),
    )

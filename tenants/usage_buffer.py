"""Usage ledger writes, batched: workers push finished requests to a Redis list and a beat
task moves them to the database in bulk.

One INSERT of a hundred rows costs about what one row costs on its own, and the request path
does no database write at all. Rows are idempotent on `request_id`, so a batch written twice
(a flush that died after inserting, before trimming) keeps one row per request.

The INSERT is written here rather than by `bulk_create`: the ORM prepares each value of each
row through its field (19 fields a row), which made the flush a quarter of a worker's CPU
under load (yappi, bench/online_overhead.py); the rows come from our own workers, so their
values only need the defaults filled in and the timestamp adapted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field

from config.redis import redis_client
from tenants.models import UsageRecord

log = logging.getLogger(__name__)

PENDING_KEY = "gs:usage:pending"
FLUSH_LOCK_KEY = "gs:usage:flush-lock"
FLUSH_BATCH = 500


def usage_push(fields: dict[str, Any]) -> None:
    """Queue one finished request for the ledger (`finished_at` as an ISO string)."""
    redis_client().rpush(PENDING_KEY, json.dumps(fields))


@cache
def _columns() -> tuple[Field[Any, Any], ...]:
    """The ledger's columns a row fills (all but the id), in the INSERT's order."""
    return tuple(f for f in UsageRecord._meta.concrete_fields if not f.primary_key)


def _values(fields: dict[str, Any]) -> list[Any]:
    """One pushed row as the INSERT's values; ValueError/TypeError/KeyError if malformed."""
    unknown = set(fields) - {f.attname for f in _columns()}
    if unknown:
        raise TypeError(f"unknown fields {sorted(unknown)}")
    finished_at = connection.ops.adapt_datetimefield_value(
        datetime.fromisoformat(fields["finished_at"])
    )
    return [
        finished_at if f.attname == "finished_at" else fields.get(f.attname, f.get_default())
        for f in _columns()
    ]


def _insert(rows: Sequence[list[Any]]) -> None:
    """INSERTs of all `rows`, as many per statement as the database takes parameters (SQLite:
    999, so 52 rows); a row whose request is already in the ledger is skipped."""
    if not rows:
        return
    columns = _columns()
    quote = connection.ops.quote_name
    names = ", ".join(quote(f.column) for f in columns)
    one = "(" + ", ".join(["%s"] * len(columns)) + ")"
    per_statement = max(1, connection.ops.bulk_batch_size(list(columns), list(rows)))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            cursor.execute(
                f"INSERT INTO {quote(UsageRecord._meta.db_table)} ({names}) "
                f"VALUES {', '.join([one] * len(chunk))} ON CONFLICT DO NOTHING",
                [value for row in chunk for value in row],
            )


def usage_flush(*, max_batches: int = 20) -> int:
    """Moves pending rows to the ledger; returns how many. One flusher at a time (a lock), so
    the trim after an insert removes exactly what was inserted."""
    client = redis_client()
    if not client.set(FLUSH_LOCK_KEY, "1", nx=True, ex=60):
        return 0
    written = 0
    try:
        for _ in range(max_batches):
            raw = client.lrange(PENDING_KEY, 0, FLUSH_BATCH - 1)
            if not raw:
                break
            rows = []
            for item in raw:
                try:
                    rows.append(_values(json.loads(item)))
                except (ValueError, TypeError, KeyError) as exc:  # must not block the rest
                    log.error("dropping a malformed usage row %r: %s", item[:200], exc)
            _insert(rows)
            client.ltrim(PENDING_KEY, len(raw), -1)
            written += len(rows)
    finally:
        client.delete(FLUSH_LOCK_KEY)
    return written

"""Usage ledger writes, batched: finished requests wait in Redis lists and the workers' ticker
(`workers.periodic`, every GPUSHARE_USAGE_FLUSH_INTERVAL_S) moves them to the database in
bulk. A worker's release appends its row to its pool's outbox (`outbox`: of the pool's slot,
where the release's script runs); a web's own rows go to PENDING_KEY. The flush drains them
all.

One INSERT of a hundred rows costs about what one row costs on its own, and the request path
does no database write at all. Rows are idempotent on `request_id`, so a batch written twice
(a flush that died after inserting, before trimming) keeps one row per request.

The INSERT is written here rather than by `bulk_create`: the ORM prepares each value of each
row through its field (19 fields a row), which would make the flush a quarter of a worker's CPU
under load (docs/decisions/0008-the-request-path-spends-cpu-once.md); the rows come from our
own workers, so their values only need the defaults filled in and the timestamp adapted.

On PostgreSQL a batch is one statement of one parameter, the rows as a JSON array that
`json_populate_recordset` reads as the ledger's own row type (the server converts each value
to its column's type, so no types are spelled here). Its text is the same at every flush:
psycopg's client-side binding (Django's default) rewrites a query's placeholders with a regex
and caches the result only for queries of at most 4096 characters and 50 parameters, so a
`VALUES (%s, ...), ...` of up to 500 rows x 19 values would be converted anew at each flush,
most of its CPU. The JSON statement takes 0.4-0.6x the worker's CPU of that form for 20 rows,
0.25-0.35x for 500 (`bench/ledger_flush.py` compares them;
docs/decisions/0008-the-request-path-spends-cpu-once.md). Other databases (SQLite: `make run`,
`make test`) keep the VALUES form, as many rows per statement as they take parameters.

Rows are JSON from Redis, and NaN and Infinity, which Python's json writes, are not JSON:
PostgreSQL's parser would refuse the whole batch, so such a row is dropped alone (and on
SQLite NaN would have failed the batch's NOT NULL columns).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DataError, connection, transaction
from django.db.models import Field

from fairqueue.keys import Keys
from plumbing.redis import redis_client
from protocol.fields import MAX_USER_CHARS
from tenants.models import UsageRecord

log = logging.getLogger(__name__)

PENDING_KEY = "gs:usage:pending"
FLUSH_LOCK_KEY = "gs:usage:flush-lock"
FLUSH_BATCH = 500


def end_user(body: Mapping[str, Any]) -> str:
    """The end user a request's body names (OpenAI's `user`), as its ledger row keeps it:
    '' when none. The body was checked when the request came (a string of at most 256
    characters without control characters, or null); the cut and the NUL's removal only keep
    a row the column cannot hold out of the batch."""
    user = body.get("user")
    return user[:MAX_USER_CHARS].replace("\x00", "") if isinstance(user, str) else ""


def outbox(pool: str) -> str:
    """The pool's outbox of ledger rows, which its releases append to (`Keys.ledger`)."""
    return Keys(settings.GPUSHARE_SCHED_KEY_PREFIX).ledger(pool)


def pending_keys(client: Any) -> list[str]:
    """Every list rows wait in: PENDING_KEY, then each pool's outbox."""
    keys = Keys(settings.GPUSHARE_SCHED_KEY_PREFIX)
    pools = sorted(p.decode() if isinstance(p, bytes) else p for p in client.smembers(keys.pools()))
    return [PENDING_KEY, *(keys.ledger(pool) for pool in pools)]


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


def _no_constant(name: str) -> float:
    """json.loads' hook for NaN and Infinity: not JSON, and no ledger value either."""
    raise ValueError(f"{name} is not a number the ledger keeps")


def _insert(rows: Sequence[list[Any]]) -> None:
    """Writes `rows` to the ledger; a row whose request is already there is skipped."""
    if not rows:
        return
    columns = _columns()
    quote = connection.ops.quote_name
    table = quote(UsageRecord._meta.db_table)
    names = ", ".join(quote(f.column) for f in columns)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The rows as one JSON array of objects keyed by column: the statement's text is
            # the same at every flush, so psycopg converts it once and caches it.
            # `datetime.isoformat` writes `finished_at`; ensure_ascii=False sends text as it
            # is rather than as \u escapes; allow_nan=False: PostgreSQL's JSON has no NaN
            # (usage_flush drops such rows before, this only makes sure).
            keys = [f.column for f in columns]
            cursor.execute(
                f"INSERT INTO {table} ({names}) SELECT {names} "
                f"FROM json_populate_recordset(NULL::{table}, %s::json) ON CONFLICT DO NOTHING",
                [
                    json.dumps(
                        [dict(zip(keys, row, strict=True)) for row in rows],
                        default=datetime.isoformat,
                        ensure_ascii=False,
                        allow_nan=False,
                    )
                ],
            )
            return
        # As many rows per statement as the database takes parameters (SQLite: 999, so 52).
        one = "(" + ", ".join(["%s"] * len(columns)) + ")"
        per_statement = max(1, connection.ops.bulk_batch_size(list(columns), list(rows)))
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            cursor.execute(
                f"INSERT INTO {table} ({names}) "
                f"VALUES {', '.join([one] * len(chunk))} ON CONFLICT DO NOTHING",
                [value for row in chunk for value in row],
            )


def _insert_or_skip(rows: Sequence[list[Any]]) -> int:
    """`_insert`, and where the database refuses the batch for what a row holds (a value its
    column cannot take), each row alone: the refused ones are logged and dropped, so one bad
    row never stops the ledger of every tenant. A database that is down raises as before.
    Returns the rows written."""
    try:
        with transaction.atomic():
            _insert(rows)
        return len(rows)
    except DataError as exc:
        log.error(
            "the ledger refused a batch of %d rows (%s); writing them one by one", len(rows), exc
        )
    written = 0
    for row in rows:
        try:
            with transaction.atomic():
                _insert([row])
            written += 1
        except DataError as exc:
            log.error("dropping a usage row the ledger refuses %r: %s", row[:4], exc)
    return written


def usage_flush(*, max_batches: int = 20) -> int:
    """Moves pending rows to the ledger; returns how many. One flusher at a time (a lock), so
    the trim after an insert removes exactly what was inserted."""
    client = redis_client()
    # Nothing pending (an idle platform, every second): two round trips, not the lock's three.
    keys = pending_keys(client)
    if not client.exists(*keys):
        return 0
    if not client.set(FLUSH_LOCK_KEY, "1", nx=True, ex=60):
        return 0
    written, batches = 0, 0
    try:
        for key in keys:
            while batches < max_batches:
                raw = client.lrange(key, 0, FLUSH_BATCH - 1)
                if not raw:
                    break
                batches += 1
                written += _insert_or_skip(_rows(raw))
                client.ltrim(key, len(raw), -1)
    finally:
        client.delete(FLUSH_LOCK_KEY)
    return written


def _rows(raw: list[Any]) -> list[list[Any]]:
    """The INSERT's values of the rows read; a malformed one is logged and dropped."""
    rows = []
    for item in raw:
        try:
            rows.append(_values(json.loads(item, parse_constant=_no_constant)))
        except (ValueError, TypeError, KeyError) as exc:  # must not block the rest
            log.error("dropping a malformed usage row %r: %s", item[:200], exc)
    return rows

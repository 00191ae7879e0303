"""Usage ledger writes, batched: workers push finished requests to a Redis list and a beat
task moves them to the database in bulk.

One INSERT of a hundred rows costs about what one row costs on its own, and the request path
does no database write at all. Rows are idempotent on `request_id`, so a batch written twice
(a flush that died after inserting, before trimming) keeps one row per request.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from config.redis import redis_client
from tenants.models import UsageRecord

log = logging.getLogger(__name__)

PENDING_KEY = "gs:usage:pending"
FLUSH_LOCK_KEY = "gs:usage:flush-lock"
FLUSH_BATCH = 500


def usage_push(fields: dict[str, Any]) -> None:
    """Queue one finished request for the ledger (`finished_at` as an ISO string)."""
    redis_client().rpush(PENDING_KEY, json.dumps(fields))


def _record(fields: dict[str, Any]) -> UsageRecord:
    values = {k: v for k, v in fields.items() if k != "finished_at"}
    return UsageRecord(finished_at=datetime.fromisoformat(fields["finished_at"]), **values)


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
                    rows.append(_record(json.loads(item)))
                except (ValueError, TypeError) as exc:  # a malformed row must not block the rest
                    log.error("dropping a malformed usage row %r: %s", item[:200], exc)
            UsageRecord.objects.bulk_create(rows, ignore_conflicts=True)
            client.ltrim(PENDING_KEY, len(raw), -1)
            written += len(rows)
    finally:
        client.delete(FLUSH_LOCK_KEY)
    return written

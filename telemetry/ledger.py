"""The usage ledger folded into Redis counters and histogram buckets for /metrics/cluster, a page
of new rows per tick."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis
from django.db import connection

from plumbing.redis import redis_client
from telemetry.live import PREFIX, read_hash
from tenants.models import Outcome, UsageRecord

# One Redis Cluster hash tag for the three: a fold reads two of them at once and writes all
# three in one transaction.
LEDGER_CURSOR_KEY = PREFIX + "{ledger}:cursor"
LEDGER_COUNTERS_KEY = PREFIX + "{ledger}:counters"
LEDGER_HORIZON_KEY = PREFIX + "{ledger}:horizon"
# Fields of counter hashes are joined with a tab: slugs, classes and model names hold none.
SEP = "\t"
# Seconds; the admission-wait, time-to-first-token and latency histograms of
# /metrics/cluster. The folded counters name a bucket by its index in these tuples, so a
# tuple is never edited in place: other bounds need a new counter kind (the old counts would
# land in the wrong buckets). TTFT is counted from arrival, so its buckets reach into
# queueing times too.
WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0)
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Ledger rows folded per tick at most: a long backlog catches up over several ticks.
FOLD_PAGE = 5000


# --- the ledger, folded into counters for /metrics/cluster -------------------------------


def _bucket_index(value_s: float, buckets: tuple[float, ...]) -> str:
    for index, bound in enumerate(buckets):
        if value_s <= bound:
            return str(index)
    return "inf"


def counter_field(*parts: object) -> str:
    return SEP.join(str(p) for p in parts)


def _fold_increments(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    increments: dict[str, float] = {}

    def add(name: str, amount: float) -> None:
        increments[name] = increments.get(name, 0.0) + amount

    for row in rows:
        labels = (row["tenant__slug"], row["request_class"], row["model"])
        add(counter_field("req", *labels, row["outcome"]), row["requests"])
        add(counter_field("tok", *labels, "prompt"), row["prompt_tokens"])
        add(counter_field("tok", *labels, "completion"), row["completion_tokens"])
        if row["cached_tokens"]:  # of the prompt tokens: a series of its own, not a kind
            add(counter_field("cached", *labels), row["cached_tokens"])
        if row["outcome"] in (Outcome.REJECTED, Outcome.TIMEOUT):
            continue  # never admitted: no admission wait, no run
        wait_s, latency_s = row["queue_wait_ms"] / 1000.0, row["latency_ms"] / 1000.0
        add(counter_field("wait", *labels, _bucket_index(wait_s, WAIT_BUCKETS_S)), 1)
        add(counter_field("wait_sum", *labels), wait_s)
        add(counter_field("lat", *labels, _bucket_index(latency_s, LATENCY_BUCKETS_S)), 1)
        add(counter_field("lat_sum", *labels), latency_s)
        if row["ttft_ms"] is not None:  # None: no token came (an error before the first)
            ttft_s = row["ttft_ms"] / 1000.0
            add(counter_field("ttft", *labels, _bucket_index(ttft_s, TTFT_BUCKETS_S)), 1)
            add(counter_field("ttft_sum", *labels), ttft_s)
    return increments


def ledger_fold(client: redis.Redis | None = None, *, page: int = FOLD_PAGE) -> int:
    """Adds ledger rows newer than the cursor to the counters; returns how many.

    Ids are handed out when a row is inserted but seen when its transaction commits, so a
    bulk write still in flight can hold ids below one already visible. A fold therefore
    reads only up to the newest id the *previous* fold saw (a tick ago): a row is counted
    one tick late rather than skipped. Callers hold the sampler's lock, so two folds never
    count a row twice: the counters and the cursor move together in one transaction.
    """
    client = client or redis_client()
    cursor, horizon = (int(v or 0) for v in client.mget(LEDGER_CURSOR_KEY, LEDGER_HORIZON_KEY))
    newest = _newest_ledger_id()
    rows = (
        []
        if horizon <= cursor
        else list(  # nothing new below the horizon: no query
            UsageRecord.objects.filter(pk__gt=cursor, pk__lte=horizon)
            .order_by("pk")
            .values(
                "pk",
                "tenant__slug",
                "request_class",
                "model",
                "outcome",
                "prompt_tokens",
                "completion_tokens",
                "cached_tokens",
                "queue_wait_ms",
                "ttft_ms",
                "latency_ms",
                "requests",
            )[:page]
        )
    )
    pipe = client.pipeline(transaction=True)
    for name, amount in _fold_increments(rows).items():
        pipe.hincrbyfloat(LEDGER_COUNTERS_KEY, name, amount)
    if rows:
        pipe.set(LEDGER_CURSOR_KEY, rows[-1]["pk"])
    if len(rows) < page:  # caught up to the horizon: the next fold may go as far as now
        pipe.set(LEDGER_HORIZON_KEY, newest)
    pipe.execute()
    return len(rows)


def _newest_ledger_id() -> int:
    """The ledger's highest id. In SQL of its own: the ORM's aggregate cost more CPU to
    compile than the database took to answer it, every tick."""
    meta, quote = UsageRecord._meta, connection.ops.quote_name
    with connection.cursor() as cursor:
        # The model's own table and column: nothing from outside goes into this SQL.
        cursor.execute(f"SELECT MAX({quote(meta.pk.column)}) FROM {quote(meta.db_table)}")
        row = cursor.fetchone()
    return int(row[0] or 0) if row else 0


def ledger_counters(client: redis.Redis | None = None) -> dict[tuple[str, ...], float]:
    raw = read_hash(client or redis_client(), LEDGER_COUNTERS_KEY)
    return {tuple(name.split(SEP)): float(value) for name, value in raw.items()}

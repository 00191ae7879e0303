"""The usage ledger's flush on PostgreSQL: the worker's own CPU time per `usage_flush()`, the
module as it is (one JSON parameter, one fixed statement) against the multi-row
`INSERT ... VALUES (%s, ...), ...` it used before (`old_insert`, copied below), in the same run.

Makes a database of its own on the server of --database-url, migrates it (Django's migrate),
and pushes rows shaped like the workers' (workers/dispatch.py `usage_fields`: all 19 fields,
some NULLs) to Redis (--redis-url, database 7 by default; only the ledger's two keys are
touched). Then, in --rounds alternating rounds, each way flushes --flushes batches of --rows
rows (20 x 20: a platform at 20 requests/s flushing every second), then --big-flushes batches
of 500 (a backlog, a full batch). Only `usage_flush()` is timed, by time.process_time: the
client process's CPU (reading Redis, the rows' JSON and values, psycopg's query conversion),
not the servers'. Prints CPU per flush and per row for each way and the ratio new/old, checks
that every row pushed is in the ledger, and drops the database.

    .venv/bin/python bench/ledger_flush.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch
from urllib.parse import urlparse, urlunparse

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BIG_BATCH = 500  # usage_buffer.FLUSH_BATCH, a full batch

Insert = Callable[[Sequence[list[Any]]], None]


def old_insert(rows: Sequence[list[Any]]) -> None:
    """The baseline: tenants/usage_buffer.py's `_insert` before, multi-row VALUES lists."""
    from django.db import connection

    from tenants.models import UsageRecord
    from tenants.usage_buffer import _columns

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


def setup_django(base_url: str, redis_url: str) -> str:
    """Creates a scratch database, points Django at it and migrates it; returns its name."""
    name = f"gs_bench_ledger_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = urlunparse(urlparse(base_url)._replace(path=f"/{name}"))
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return name


def drop_database(base_url: str, name: str) -> None:
    from django.db import connections

    connections.close_all()
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Rows:
    """Pushes rows shaped like the workers' ones, each with a request id of its own."""

    def __init__(self, tenant_id: int, api_key_id: int) -> None:
        self.tenant_id, self.api_key_id, self.count = tenant_id, api_key_id, 0

    def push(self, n: int) -> None:
        from tenants.usage_buffer import usage_push

        for _ in range(n):
            i = self.count = self.count + 1
            usage_push({
                "request_id": f"job-{uuid.uuid4().hex}", "tenant_id": self.tenant_id,
                "api_key_id": None if i % 5 == 0 else self.api_key_id,
                "model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm-a100-0",
                "request_class": "standard", "batch_id": "", "endpoint": "chat.completions",
                "outcome": "success", "status_code": 200, "prompt_tokens": 100 + i % 300,
                "completion_tokens": 1 + i % 200, "reserved_units": 1.5,
                "reserved_unit_seconds": 0.25 * (i % 40), "queue_wait_ms": i % 17,
                "ttft_ms": None if i % 7 == 0 else 30 + i % 50, "latency_ms": 400 + i % 900,
                "error_code": "", "finished_at": datetime.now(UTC).isoformat(),
            })  # fmt: skip


def timed_flushes(insert: Insert, rows: Rows, flushes: int, per_flush: int) -> float:
    """CPU seconds of `flushes` calls of usage_flush(), each moving `per_flush` rows."""
    from tenants import usage_buffer

    cpu = 0.0
    # usage_flush looks `_insert` up at each call: patched for the round, then put back.
    with patch.object(usage_buffer, "_insert", insert):
        for _ in range(flushes):
            rows.push(per_flush)
            start = time.process_time()
            written = usage_buffer.usage_flush()
            cpu += time.process_time() - start
            if written != per_flush:
                raise RuntimeError(f"flushed {written} rows, not {per_flush}")
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default="postgres://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server; the benchmark makes a database of its own there",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds each way")
    parser.add_argument("--flushes", type=int, default=20, help="small flushes each round")
    parser.add_argument("--rows", type=int, default=20, help="rows per small flush")
    parser.add_argument("--big-flushes", type=int, default=4,
                        help=f"flushes of {BIG_BATCH} rows each round")  # fmt: skip
    args = parser.parse_args()

    name = setup_django(args.database_url, args.redis_url)
    try:
        from plumbing.redis import redis_client
        from tenants import usage_buffer
        from tenants.models import Tenant, UsageRecord
        from tenants.services import api_key_create

        client = redis_client()
        client.delete(usage_buffer.PENDING_KEY, usage_buffer.FLUSH_LOCK_KEY)
        tenant = Tenant.objects.create(slug="bench", name="Bench")
        rows = Rows(tenant.pk, api_key_create(tenant=tenant, name="bench").api_key.pk)
        ways: dict[str, Insert] = {"old": old_insert, "new": usage_buffer._insert}
        for insert in ways.values():  # warm: connections, psycopg's caches, Django's lazy parts
            timed_flushes(insert, rows, 2, args.rows)
        print(f"PostgreSQL, database {name}; {args.rounds} alternating rounds each way")
        for flushes, per_flush in [(args.flushes, args.rows), (args.big_flushes, BIG_BATCH)]:
            cpu = dict.fromkeys(ways, 0.0)
            for round_index in range(args.rounds):
                order = list(ways) if round_index % 2 == 0 else list(reversed(ways))
                for way in order:
                    cpu[way] += timed_flushes(ways[way], rows, flushes, per_flush)
            n = flushes * args.rounds
            print(f"\n{n} flushes of {per_flush} rows each way:")
            for way, seconds in cpu.items():
                print(
                    f"  {way}: {seconds / n * 1e3:7.3f} ms CPU per flush, "
                    f"{seconds / (n * per_flush) * 1e6:6.1f} us per row"
                )
            print(f"  ratio new/old: {cpu['new'] / cpu['old']:.2f}")
        written = UsageRecord.objects.count()
        if written != rows.count:
            raise RuntimeError(f"{rows.count} rows pushed but {written} in the ledger")
        print(f"\n{written} rows in the ledger, as pushed")
        client.delete(usage_buffer.PENDING_KEY, usage_buffer.FLUSH_LOCK_KEY)
    finally:
        drop_database(args.database_url, name)


if __name__ == "__main__":
    main()

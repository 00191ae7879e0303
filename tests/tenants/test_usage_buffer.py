from datetime import UTC, datetime

import pytest

from tenants.models import UsageRecord
from tenants.usage_buffer import (
    FLUSH_BATCH,
    FLUSH_LOCK_KEY,
    PENDING_KEY,
    usage_flush,
    usage_push,
)

pytestmark = pytest.mark.django_db


def fields(tenant, request_id: str, **extra) -> dict:
    return {
        "request_id": request_id, "tenant_id": tenant.pk, "model": "m",
        "request_class": "standard", "outcome": "success", "prompt_tokens": 3,
        "completion_tokens": 5, "finished_at": datetime(2026, 11, 30, tzinfo=UTC).isoformat(),
        **extra,
    }  # fmt: skip


def test_pushed_rows_reach_the_ledger_in_one_flush(owner, redis_db):
    for i in range(7):
        usage_push(fields(owner, f"r{i}"))
    assert usage_flush() == 7
    assert UsageRecord.objects.filter(tenant=owner).count() == 7
    assert redis_db.llen(PENDING_KEY) == 0


def test_a_full_batch_is_written_whatever_the_database_s_parameter_limit(owner, redis_db):
    """500 rows of 19 values: more parameters than SQLite takes in one statement (999)."""
    for i in range(FLUSH_BATCH):
        usage_push(fields(owner, f"r{i}"))
    assert usage_flush() == FLUSH_BATCH
    assert UsageRecord.objects.filter(tenant=owner).count() == FLUSH_BATCH
    assert redis_db.llen(PENDING_KEY) == 0


def test_a_row_flushed_twice_is_kept_once(owner, redis_db):
    usage_push(fields(owner, "same"))
    usage_flush()
    usage_push(fields(owner, "same", completion_tokens=99))  # e.g. a job that ran twice
    usage_flush()
    record = UsageRecord.objects.get(request_id="same")
    assert record.completion_tokens == 5


def test_only_one_flusher_at_a_time(owner, redis_db):
    usage_push(fields(owner, "r1"))
    redis_db.set(FLUSH_LOCK_KEY, "1")
    assert usage_flush() == 0
    assert redis_db.llen(PENDING_KEY) == 1


def test_a_malformed_row_does_not_block_the_others(owner, redis_db):
    redis_db.rpush(PENDING_KEY, "{not json")
    usage_push(fields(owner, "good"))
    assert usage_flush() == 1
    assert UsageRecord.objects.filter(request_id="good").exists()
    assert redis_db.llen(PENDING_KEY) == 0


def test_a_row_gets_the_ledger_s_defaults_for_what_it_leaves_out(owner, redis_db):
    usage_push(fields(owner, "short"))  # no engine, batch, latency, ttft, ...
    usage_push(fields(owner, "full", engine="e1", batch_id="batch_1", ttft_ms=12, latency_ms=40,
                      reserved_units=1.5, status_code=429, error_code="rate_limited"))  # fmt: skip
    assert usage_flush() == 2
    short = UsageRecord.objects.get(request_id="short")
    assert (short.engine, short.batch_id, short.ttft_ms, short.latency_ms) == ("", "", None, 0)
    assert (short.status_code, short.reserved_units) == (200, 0)
    assert short.finished_at == datetime(2026, 11, 30, tzinfo=UTC)
    full = UsageRecord.objects.get(request_id="full")
    assert (full.engine, full.batch_id, full.ttft_ms, full.latency_ms) == ("e1", "batch_1", 12, 40)
    assert (full.status_code, full.error_code, full.reserved_units) == (429, "rate_limited", 1.5)


def test_a_row_with_a_field_the_ledger_does_not_have_is_dropped_alone(owner, redis_db):
    usage_push(fields(owner, "odd", colour="blue"))
    usage_push(fields(owner, "fine"))
    assert usage_flush() == 1
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == ["fine"]

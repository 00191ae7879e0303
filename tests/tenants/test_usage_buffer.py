import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from tenants.models import UsageRecord
from tenants.usage_buffer import (
    FLUSH_BATCH,
    FLUSH_LOCK_KEY,
    PENDING_KEY,
    end_user,
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
    """500 rows of 19 values: more parameters than SQLite takes in one statement (999), and
    on PostgreSQL one JSON parameter; every row keeps its own values, whole and in place."""
    expected = set()
    for i in range(FLUSH_BATCH):
        row = {"engine": f"e{i}", "prompt_tokens": i, "reserved_units": i / 4,
               "ttft_ms": None if i % 3 else i * 2}  # fmt: skip
        if i % 2:
            del row["engine"]  # half the rows leave a field out
        usage_push(fields(owner, f"r{i}", **row))
        expected.add((f"r{i}", row.get("engine", ""), i, i / 4, row["ttft_ms"]))
    assert usage_flush(max_batches=1) == FLUSH_BATCH  # in one batch
    written = UsageRecord.objects.filter(tenant=owner).values_list(
        "request_id", "engine", "prompt_tokens", "reserved_units", "ttft_ms"
    )
    assert set(written) == expected
    assert len(written) == FLUSH_BATCH
    assert redis_db.llen(PENDING_KEY) == 0


def test_a_row_flushed_twice_is_kept_once(owner, redis_db):
    usage_push(fields(owner, "same"))
    usage_flush()
    usage_push(fields(owner, "same", completion_tokens=99))  # e.g. a job that ran twice
    usage_flush()
    record = UsageRecord.objects.get(request_id="same")
    assert record.completion_tokens == 5


def test_a_row_pushed_twice_in_one_batch_is_kept_once(owner, redis_db):
    usage_push(fields(owner, "same"))
    usage_push(fields(owner, "same", completion_tokens=99))
    usage_push(fields(owner, "other"))
    usage_flush()
    assert UsageRecord.objects.filter(tenant=owner).count() == 2
    assert UsageRecord.objects.get(request_id="same").completion_tokens == 5


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


def test_a_row_with_only_the_required_fields_gets_every_default(owner, redis_db):
    usage_push({"request_id": "bare", "tenant_id": owner.pk, "model": "m",
                "request_class": "standard", "outcome": "success",
                "finished_at": datetime(2026, 11, 30, tzinfo=UTC).isoformat()})  # fmt: skip
    assert usage_flush() == 1
    bare = UsageRecord.objects.values().get(request_id="bare")
    assert {k: v for k, v in bare.items() if k != "id"} == {
        "request_id": "bare", "tenant_id": owner.pk, "api_key_id": None, "model": "m",
        "engine": "", "request_class": "standard", "batch_id": "", "endpoint": "",
        "end_user": "", "outcome": "success", "status_code": 200, "prompt_tokens": 0,
        "completion_tokens": 0, "cached_tokens": 0,
        "reserved_units": 0, "reserved_unit_seconds": 0, "queue_wait_ms": 0, "ttft_ms": None,
        "latency_ms": 0, "error_code": "", "finished_at": datetime(2026, 11, 30, tzinfo=UTC),
        "requests": 1,
    }  # fmt: skip


def test_nulls_are_written_as_nulls_and_values_beside_them_as_values(owner, owner_key, redis_db):
    key = owner_key.api_key
    usage_push(fields(owner, "nulls", api_key_id=None, ttft_ms=None))
    usage_push(fields(owner, "set", api_key_id=key.pk, ttft_ms=0))
    assert usage_flush() == 2
    assert UsageRecord.objects.filter(api_key__isnull=True, ttft_ms__isnull=True).count() == 1
    assert UsageRecord.objects.get(request_id="nulls").api_key_id is None
    written = UsageRecord.objects.get(request_id="set")
    assert (written.api_key_id, written.ttft_ms) == (key.pk, 0)


AWKWARD = [
    "",
    "it's \"quoted\" ''twice''",
    "back\\slash \\n \\\\ \\'",
    "{braces},{a,b} {}",
    "a,b,,c",
    "NULL",
    "null",
    "(1,2)",
    "[1, 2]",
    "été 中文 😀 \u200b",
    "line\nbreak\ttab\r",
    "  padded  ",
    "%s %(x)s %%",
]


@pytest.mark.parametrize("text", AWKWARD)
def test_text_is_written_exactly_whatever_its_characters(owner, redis_db, text):
    usage_push(fields(owner, "awkward", model=text, engine=text, error_code=text,
                      batch_id=text, endpoint=text, end_user=text))  # fmt: skip
    usage_push(fields(owner, "plain", model="m"))  # a neighbour, so the text is one of several
    assert usage_flush() == 2
    written = UsageRecord.objects.get(request_id="awkward")
    assert [written.model, written.engine, written.error_code, written.batch_id,
            written.endpoint, written.end_user] == [text] * 6  # fmt: skip
    assert UsageRecord.objects.get(request_id="plain").model == "m"


def test_the_longest_end_user_a_request_may_name_is_kept_whole(owner, redis_db):
    longest = "😀" * 256  # characters, as the request's check counts them: 1 KiB of UTF-8
    usage_push(fields(owner, "long", end_user=end_user({"user": longest})))
    assert usage_flush() == 1
    assert UsageRecord.objects.get(request_id="long").end_user == longest


def test_a_row_the_database_refuses_is_dropped_alone_and_the_ledger_goes_on(owner, redis_db):
    """A NUL is text no PostgreSQL column holds (SQLite takes it): the batch is refused
    whole there, and then written row by row, the refused row dropped. The flush after it
    finds the ledger moving, not the same batch again."""
    usage_push(fields(owner, "before"))
    usage_push(fields(owner, "nul", end_user="a\x00b", model="m\x00"))
    usage_push(fields(owner, "after"))
    written = usage_flush()
    assert redis_db.llen(PENDING_KEY) == 0
    kept = set(UsageRecord.objects.values_list("request_id", flat=True))
    assert {"before", "after"} <= kept
    if connection.vendor == "postgresql":
        assert (written, kept) == (2, {"before", "after"})
    usage_push(fields(owner, "next"))
    assert usage_flush() == 1


def test_a_request_s_end_user_never_holds_a_nul(owner, redis_db):
    usage_push(fields(owner, "u", end_user=end_user({"user": "x\x00y"})))
    assert usage_flush() == 1
    assert UsageRecord.objects.get(request_id="u").end_user == "xy"


@pytest.mark.parametrize(("body", "kept"), [({}, ""), ({"user": None}, ""), ({"user": "u1"}, "u1")])
def test_a_body_without_a_user_is_kept_as_nobody(body, kept):
    assert end_user(body) == kept


def test_a_request_id_with_awkward_characters_is_kept_exactly(owner, redis_db):
    ids = ["q'\"\\{},", "é😀", "NULL"]
    for request_id in ids:
        usage_push(fields(owner, request_id))
    assert usage_flush() == len(ids)
    assert sorted(UsageRecord.objects.values_list("request_id", flat=True)) == sorted(ids)


def test_finished_at_keeps_its_instant_whatever_its_offset(owner, redis_db):
    ist = timezone(timedelta(hours=5, minutes=30))
    instant = datetime(2026, 11, 30, 12, 34, 56, 789012, tzinfo=ist)
    usage_push(fields(owner, "ist", finished_at=instant.isoformat()))
    usage_push(fields(owner, "zulu", finished_at="2026-11-30T07:04:56.789012Z"))
    assert usage_flush() == 2
    assert UsageRecord.objects.get(request_id="ist").finished_at == instant
    assert UsageRecord.objects.get(request_id="zulu").finished_at == instant


def test_a_row_with_a_timestamp_that_is_not_one_is_dropped_alone(owner, redis_db):
    usage_push(fields(owner, "late", finished_at="yesterday"))
    usage_push(fields(owner, "fine"))
    assert usage_flush() == 1
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == ["fine"]


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_row_with_a_number_json_does_not_have_is_dropped_alone(owner, redis_db, constant):
    """Python's json writes NaN and Infinity; neither is JSON nor a usage figure."""
    row = json.dumps(fields(owner, "odd", reserved_units=1.0)).replace("1.0", constant)
    redis_db.rpush(PENDING_KEY, row)
    usage_push(fields(owner, "fine"))
    assert usage_flush() == 1
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == ["fine"]
    assert redis_db.llen(PENDING_KEY) == 0


def test_on_postgresql_each_batch_is_one_short_statement_whatever_its_size(owner, redis_db):
    """psycopg converts a statement's placeholders once and caches it only if the statement is
    at most 4096 characters with at most 50 parameters: the same text at every flush."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite writes VALUES lists, as many rows a statement as it takes")
    statements = []

    def record(execute, sql, params, many, context):
        statements.append((sql, len(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        for size in (1, FLUSH_BATCH):
            for i in range(size):
                usage_push(fields(owner, f"r{size}-{i}"))
            assert usage_flush() == size
    inserts = [(sql, n) for sql, n in statements if sql.startswith("INSERT")]
    assert len(inserts) == 2
    assert inserts[0] == inserts[1]
    assert len(inserts[0][0]) <= 4096
    assert inserts[0][1] == 1

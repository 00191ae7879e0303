"""The console's reports page and the tenant page's usage charts, over a real usage ledger."""

from __future__ import annotations

import csv
import io
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.test import Client
from django.utils import timezone

from tenants.models import Tenant, UsageRecord
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db

START = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def ledger_row(
    tenant: Tenant,
    finished: datetime,
    *,
    seconds: float,
    units: float,
    prompt: int = 100,
    completion: int = 50,
    outcome: str = "success",
    status: int = 200,
    cached: int = 0,
) -> UsageRecord:
    """A finished request that held `units` for `seconds` before `finished`."""
    return UsageRecord.objects.create(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="llama",
        request_class="standard",
        outcome=outcome,
        status_code=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        reserved_units=units,
        reserved_unit_seconds=units * seconds,
        queue_wait_ms=20,
        latency_ms=int(seconds * 1000) + 20,
        finished_at=finished,
    )


@pytest.fixture
def ledger(redis_db: redis.Redis) -> tuple[Tenant, Tenant]:
    """acme held 8 units for the first hour (its whole quota of 4, twice over) and made two
    requests; globex one request and one refusal."""
    acme = TenantFactory.create(slug="acme", quota_units=4)
    globex = TenantFactory.create(slug="globex", quota_units=2)
    ledger_row(acme, START + timedelta(hours=1), seconds=3600, units=8)
    ledger_row(acme, START + timedelta(hours=2), seconds=1, units=1, prompt=10, completion=5)
    ledger_row(globex, START + timedelta(minutes=30), seconds=60, units=1)
    ledger_row(
        globex, START + timedelta(minutes=31), seconds=0, units=0, outcome="rejected", status=429
    )
    return acme, globex


RANGE = {"since": "2026-11-02T08:00", "until": "2026-11-02T12:00"}


def test_the_report_shows_each_tenant_over_the_range(console: Client, ledger: tuple):
    html = console.get("/console/reports/", RANGE).content.decode()

    acme = re.search(r'<tr data-tenant="acme">.*?</tr>', html, re.S)
    globex = re.search(r'<tr data-tenant="globex">.*?</tr>', html, re.S)
    assert acme is not None
    assert globex is not None
    assert re.search(r'class="num requests">2<', acme.group(0))
    assert "110 + 55" in acme.group(0)
    assert "8.0003" in acme.group(0)  # reserved unit-hours: 8 for an hour + 1 for a second
    assert "16.00" in acme.group(0)  # quota unit-hours: 4 units x 4 hours
    assert "1 / 0 / 0 / 1" in globex.group(0)  # ok / error / timeout / 429
    assert 'data-label="acme"' in html  # the chart


def test_picking_tenants_narrows_the_report(console: Client, ledger: tuple):
    html = console.get("/console/reports/", {**RANGE, "tenants": ["globex"]}).content.decode()

    assert 'data-tenant="globex"' in html
    assert 'data-tenant="acme"' not in html


def test_rows_per_hour_and_a_tokens_chart(console: Client, ledger: tuple):
    html = console.get(
        "/console/reports/", {**RANGE, "tenants": ["acme"], "per": "hour"}
    ).content.decode()

    assert html.count('<tr data-tenant="acme">') == 4
    assert "Tokens per hour" in html
    assert 'data-series="acme"' in html


def test_the_csv_download_has_the_reports_columns(console: Client, ledger: tuple):
    response = console.get("/console/reports/", {**RANGE, "format": "csv"})

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["tenant"] for r in rows] == ["acme", "globex"]
    assert rows[0]["requests"] == "2"
    assert rows[1]["rejected_429"] == "1"


def test_a_range_that_ends_before_it_starts_is_refused(console: Client, ledger: tuple):
    response = console.get(
        "/console/reports/", {"since": "2026-11-02T12:00", "until": "2026-11-02T08:00"}
    )

    assert response.status_code == 400
    assert "is not after its start" in response.content.decode()


def test_without_a_range_the_report_covers_today(console: Client, ledger: tuple):
    response = console.get("/console/reports/")

    html = response.content.decode()
    assert response.status_code == 200
    today = timezone.now().astimezone(UTC).strftime("%Y-%m-%d 00:00")
    assert today in html


def test_the_tenant_page_charts_tokens_reservations_and_latency(console: Client, redis_db):
    acme = TenantFactory.create(slug="acme", quota_units=4)
    now = timezone.now()
    ledger_row(acme, now - timedelta(hours=3), seconds=30, units=2, prompt=700, completion=300)

    html = console.get("/console/tenants/acme/").content.decode()

    usage = re.search(r'<section class="card" id="usage">.*?</section>', html, re.S)
    assert usage is not None
    section = usage.group(0)
    assert 'data-series="tokens per hour"' in section
    assert 'data-series="peak reserved"' in section
    assert 'data-series="quota (4 units)"' in section
    assert 'stroke-dasharray="6 4"' in section  # the quota line
    assert 'data-series="latency p99"' in section
    assert "no data in this range" not in section


def test_the_tenant_page_shows_its_prefix_cache_hit_rate_over_the_range(console: Client, redis_db):
    acme = TenantFactory.create(slug="acme", quota_units=4)
    now = timezone.now()
    ledger_row(acme, now - timedelta(hours=3), seconds=1, units=1, prompt=1500, cached=1280)
    ledger_row(acme, now - timedelta(hours=2), seconds=1, units=1, prompt=500, cached=0)
    ledger_row(acme, now - timedelta(days=3), seconds=1, units=1, prompt=9000, cached=0)

    html = console.get("/console/tenants/acme/").content.decode()

    line = re.search(r'<p id="prefix-cache">(.*?)</p>', html, re.S)
    assert line is not None
    text = " ".join(line.group(1).split())
    # The last 24 hours: 1,280 of 2,000 prompt tokens; the row of 3 days ago is outside.
    assert "<strong>64 %</strong> of 2000 prompt tokens" in text


def test_the_tenant_page_charts_a_month_per_day(console: Client, redis_db):
    TenantFactory.create(slug="acme", quota_units=4)

    html = console.get("/console/tenants/acme/?usage=30d").content.decode()

    assert 'data-series="tokens per day"' in html
    assert "no data in this range" in html


def test_the_tenant_list_shows_usage_today(console: Client, redis_db):
    acme = TenantFactory.create(slug="acme", quota_units=4)
    ledger_row(acme, timezone.now() - timedelta(seconds=5), seconds=1, units=1)

    html = console.get("/console/tenants/").content.decode()

    assert "150" in html  # tokens today: 100 + 50

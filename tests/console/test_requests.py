"""The console's "Find a request": a request's ledger row by the `X-Request-Id` it answered
with, or a clear message when the ledger has none."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.test import Client

from tenants.models import Tenant, UsageRecord
from tenants.services import IssuedKey

pytestmark = pytest.mark.django_db

REQUEST_ID = "5f0c8e2a9b7d4c1e8a3f6b2d9e0c7a14"


@pytest.fixture
def record(owner: Tenant, owner_key: IssuedKey) -> UsageRecord:
    return UsageRecord.objects.create(
        request_id=REQUEST_ID, tenant=owner, api_key=owner_key.api_key, model="llama-8b",
        engine="llama-a", request_class="interactive", endpoint="/v1/chat/completions",
        outcome="error", status_code=503, prompt_tokens=321, completion_tokens=12,
        queue_wait_ms=1500, ttft_ms=240, latency_ms=2750, error_code="engine_unavailable",
        finished_at=datetime(2026, 12, 4, 9, 30, 15, tzinfo=UTC),
    )  # fmt: skip


def facts(html: str) -> dict[str, str]:
    """The record's facts, <dt> to the text of its <dd>."""
    section = html.split('id="request-record"', 1)[1].split("</section>", 1)[0]
    pairs = re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", section, re.S)
    return {dt: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", dd)).strip() for dt, dd in pairs}


def test_a_request_is_found_by_its_id(console: Client, record: UsageRecord):
    response = console.get("/console/requests/", {"id": f"  {REQUEST_ID}\n"})

    assert response.status_code == 200
    html = response.content.decode()
    shown = facts(html)
    assert shown["Tenant"] == "acme"
    assert shown["Key"].startswith(record.api_key.prefix)  # type: ignore[union-attr]
    assert "owner" in shown["Key"]
    assert shown["Model"] == "llama-8b"
    assert shown["Class"] == "interactive"
    assert shown["Outcome"] == "error"
    assert shown["Status code"] == "503"
    assert shown["Tokens"] == "321 prompt + 12 completion = 333"
    assert shown["Queue wait"] == "1500 ms"
    assert shown["Time to first token"] == "240 ms"
    assert shown["Latency"] == "2750 ms"
    assert shown["Engine"] == "llama-a"
    assert shown["Error code"] == "engine_unavailable"
    assert shown["Finished at"] == "2026-12-04 09:30:15"
    assert 'href="/console/tenants/acme/"' in html
    assert "No request with that id" not in html


def test_an_unknown_id_says_so(console: Client, record: UsageRecord):
    response = console.get("/console/requests/", {"id": "0" * 32})

    assert response.status_code == 200
    html = response.content.decode()
    assert "No request with that id" in html
    assert "0" * 32 in html
    assert 'id="request-record"' not in html


def test_an_id_longer_than_any_request_id_is_not_looked_up(console: Client, record: UsageRecord):
    response = console.get("/console/requests/", {"id": REQUEST_ID * 3})

    assert "No request with that id" in response.content.decode()


def test_the_empty_page_asks_for_an_id(console: Client):
    response = console.get("/console/requests/")

    html = response.content.decode()
    assert response.status_code == 200
    assert 'name="id"' in html
    assert "No request with that id" not in html


def test_the_console_nav_links_to_it(console: Client):
    html = console.get("/console/").content.decode()

    assert 'href="/console/requests/"' in html

"""The console's live pages in a real headless Chromium: the overview's unit grids and their
htmx refresh, engines (placement preview, start with progress), queues, batches, reports and
the tenant page's usage charts. Screenshots of each go to the browser artifacts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from scheduler.models import BatchStatus, Engine, EngineStatus, LineState
from tests.browser.conftest import log_in, screenshot
from tests.console.test_batches import make_batch
from tests.console.test_engines_and_queues import Fleet, make_fleet
from tests.console.test_reports import ledger_row

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def fleet(transactional_db: None, live_redis: redis.Redis) -> Fleet:
    return make_fleet(live_redis)


def _grid(page: Page, fleet: Fleet, device: Any, kind: str) -> Any:
    return page.locator(f"#device-{device.pk} svg rect.unit.{kind}")


def test_the_overview_draws_each_gpu_as_its_units_and_refreshes_by_itself(
    page: Page, live_server: LiveServer, operator: User, fleet: Fleet
):
    log_in(page, live_server, operator, "/console/")

    expect(_grid(page, fleet, fleet.gpu0, "used")).to_have_count(96)
    expect(_grid(page, fleet, fleet.gpu0, "free")).to_have_count(224)
    expect(_grid(page, fleet, fleet.gpu1, "used")).to_have_count(0)
    expect(_grid(page, fleet, fleet.gpu1, "free")).to_have_count(96)
    # The dedicated engine's units are drawn in acme's colour, the shared one's in another.
    gpu0 = f"#device-{fleet.gpu0.pk}"
    shared = page.locator(f'{gpu0} g[data-engine="llama-a"] rect')
    dedicated = page.locator(f'{gpu0} g[data-engine="llama-b"] rect')
    expect(shared).to_have_count(64)
    expect(dedicated).to_have_count(32)
    assert shared.first.get_attribute("fill") != dedicated.first.get_attribute("fill")
    expect(page.locator("#class-interactive .waiting")).to_have_text("2")
    screenshot(page, "overview")

    # An engine starts on gpu1 elsewhere: the page shows it without a reload (htmx polling).
    Engine.objects.filter(name="qwen-c").update(status=EngineStatus.READY)
    expect(_grid(page, fleet, fleet.gpu1, "used")).to_have_count(40, timeout=15_000)
    expect(_grid(page, fleet, fleet.gpu1, "free")).to_have_count(56)


def test_an_engine_shows_where_it_would_go_and_starts_with_progress(
    page: Page, live_server: LiveServer, operator: User, fleet: Fleet
):
    log_in(page, live_server, operator, "/console/engines/")
    expect(page.locator("#engines tbody tr")).to_have_count(3)
    screenshot(page, "engines")

    page.click("#engine-qwen-c >> text=qwen-c")
    expect(page.locator("#placement-verdict")).to_contain_text("fits on node1/gpu1")
    expect(page.locator("#placement svg rect.unit.used")).to_have_count(40)
    screenshot(page, "engine-preview")

    with mock.patch("scheduler.worker_tasks.current_app") as celery:
        page.click("#progress button:has-text('Start')")
        expect(page.locator(".messages")).to_contain_text("Starting qwen-c")
    celery.send_task.assert_called_once()
    expect(page.locator("#action-progress")).to_contain_text("start requested from the console")

    # What the supervisor writes as it goes appears while the page follows the engine.
    Engine.objects.filter(name="qwen-c").update(
        status=EngineStatus.STARTING, status_detail="process 4242 launched"
    )
    page.reload()
    Engine.objects.filter(name="qwen-c").update(
        status=EngineStatus.READY, status_detail="ready in 61 s; KV capacity 81920 tokens"
    )
    expect(page.locator("#status-detail")).to_contain_text("ready in 61 s", timeout=10_000)
    expect(page.locator("#progress .badge")).to_have_text("ready")
    screenshot(page, "engine-started")


def test_the_queues_page_shows_the_fair_queue_and_the_offline_gate(
    page: Page, live_server: LiveServer, operator: User, fleet: Fleet
):
    log_in(page, live_server, operator, "/console/queues/")

    acme = page.locator('tr[data-class="interactive"][data-tenant="acme"]')
    expect(acme.locator(".waiting")).to_have_text("2")
    expect(page.locator('#gates tr[data-engine="llama-a"] .gate')).to_have_text("open")
    expect(page.locator('#gates tr[data-engine="llama-b"] .gate')).to_have_text("closed")
    screenshot(page, "queues")


def test_batches_list_their_progress_and_open_on_their_counts(
    page: Page, live_server: LiveServer, operator: User, fleet: Fleet, tmp_path: Path
):
    with mock.patch.object(settings, "GPUSHARE_BATCH_FILES_DIR", tmp_path):
        make_batch(
            fleet.acme,
            "batch_acme1",
            [LineState.SUCCEEDED] * 6 + [LineState.FAILED] * 2 + [LineState.PENDING] * 2,
        )
        make_batch(fleet.globex, "batch_globex1", [LineState.SUCCEEDED] * 4, BatchStatus.COMPLETED)
        log_in(page, live_server, operator, "/console/batches/")

        expect(page.locator("#batches tbody tr")).to_have_count(2)
        done = page.locator('tr[data-batch="batch_acme1"] .progress .done').bounding_box()
        assert done is not None
        assert 0.55 < done["width"] / _width(page, "batch_acme1") < 0.65
        screenshot(page, "batches")

        page.click("text=batch_acme1")
        expect(page.locator("#count-failed")).to_have_text("2")
        expect(page.locator("#failed-lines")).to_contain_text("line 7 broke")
        with page.expect_download() as download:
            page.click("#files >> text=input")
        assert download.value.suggested_filename == "in.jsonl"
        screenshot(page, "batch")


def _width(page: Page, batch: str) -> float:
    box = page.locator(f'tr[data-batch="{batch}"] .progress').bounding_box()
    assert box is not None
    return float(box["width"])


def test_a_report_for_picked_tenants_with_a_chart_and_a_csv(
    page: Page, live_server: LiveServer, operator: User, fleet: Fleet
):
    now = timezone.now()
    ledger_row(fleet.acme, now - timedelta(minutes=30), seconds=600, units=80)
    ledger_row(fleet.globex, now - timedelta(minutes=20), seconds=60, units=1)
    log_in(page, live_server, operator, "/console/reports/")

    page.check("input[value=acme]")
    page.select_option("#id_per", "hour")
    page.click("button:has-text('Show report')")
    expect(page.locator("#report tbody tr").first).to_contain_text("acme")
    expect(page.locator('tr[data-tenant="globex"]')).to_have_count(0)
    expect(page.locator('#report-chart g.meter[data-label="acme"]')).to_have_count(1)
    screenshot(page, "reports")
    with page.expect_download() as download:
        page.click("#csv-link")
    assert download.value.suggested_filename.endswith(".csv")
    text = Path(download.value.path()).read_text()
    assert text.splitlines()[0].startswith("tenant,since,until")
    assert ",acme," not in text.splitlines()[0]


def test_the_tenant_page_charts_its_usage_against_the_quota(
    page: Page, live_server: LiveServer, operator: User, fleet: Fleet
):
    now = timezone.now()
    for hours, units in ((5, 40), (3, 80), (1, 20)):
        ledger_row(fleet.acme, now - timedelta(hours=hours), seconds=1800, units=units)
    log_in(page, live_server, operator, "/console/tenants/acme/")

    usage = page.locator("#usage")
    expect(usage.locator('polyline[data-series="peak reserved"]')).to_have_count(1)
    expect(usage.locator('polyline[data-series="quota (64 units)"]')).to_have_count(1)
    usage.scroll_into_view_if_needed()
    screenshot(page, "tenant-usage")

"""The console's money and audit pages in a real headless Chromium: a quota changed through
the console is in the audit log with who and from where, filtered; a tenant's spend and the
prices show."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from billing.services import price_set
from tests.billing.ledger import charge
from tests.browser.conftest import log_in, screenshot
from tests.factories import TenantFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_console_change_is_in_the_audit_log_and_spend_shows(
    page: Page, live_server: LiveServer, operator: User
):
    acme = TenantFactory.create(slug="acme", quota_units=8)
    price_set(
        model="llama",
        input_per_million="2",
        output_per_million="8",
        effective_from=datetime.now(tz=UTC) - timedelta(days=40),
    )
    charge(acme, datetime.now(tz=UTC) - timedelta(seconds=5), prompt=500_000, completion=125_000)
    log_in(page, live_server, operator, "/console/tenants/acme/")
    expect(page.locator("#spend-total")).to_contain_text("2.000000")  # 0.5 x 2 + 0.125 x 8
    page.click("text=Edit quota and limits")
    page.fill("#id_quota_units", "12")
    page.click("button:has-text('Save')")
    expect(page.locator(".messages")).to_contain_text("saved")

    page.click("nav >> text=Audit log")
    page.fill("#id_action", "tenant.")
    page.click("button:has-text('Filter')")
    row = page.locator('#audit tbody tr[data-action="tenant.update"]')
    expect(row).to_have_count(1)
    expect(row).to_contain_text("browser-operator")
    expect(row).to_contain_text("console")
    expect(row).to_contain_text("127.0.0.1")
    expect(row).to_contain_text("quota_units")
    screenshot(page, "audit-log")

    page.click("nav >> text=Prices")
    expect(page.locator('#prices tr[data-model="llama"]')).to_contain_text("8.000000")

"""The console in a real headless Chromium: log in, tenants, keys, quotas, the planner."""

from __future__ import annotations

import re

import httpx
import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from tenants.models import ApiKey, Tenant
from tests.browser.conftest import log_in, screenshot
from tests.factories import TenantFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tenants(transactional_db: None) -> list[Tenant]:
    return [
        TenantFactory.create(slug="acme", name="Acme Corp", quota_units=8, burst_units=4),
        TenantFactory.create(slug="globex", name="Globex", quota_units=32, weight=3),
    ]


def test_a_visitor_must_log_in_first(page: Page, live_server: LiveServer):
    page.goto(f"{live_server.url}/console/tenants/")

    assert "/admin/login/" in page.url
    assert "next=/console/tenants/" in page.url.replace("%2F", "/")


def test_staff_log_in_and_see_the_tenants(
    page: Page, live_server: LiveServer, operator: User, tenants: list[Tenant]
):
    log_in(page, live_server, operator, "/console/tenants/")

    rows = page.locator("#tenants tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("acme")
    expect(rows.first).to_contain_text("8 units = 2.0 GiB")
    expect(rows.nth(1)).to_contain_text("32 units = 8.0 GiB")
    # The stylesheet and htmx came from our own static files.
    assert page.evaluate("typeof htmx") == "object"
    background = page.eval_on_selector(".topbar", "e => getComputedStyle(e).backgroundColor")
    assert background == "rgb(31, 41, 51)"
    screenshot(page, "tenants-list")


def test_a_new_tenant_gets_a_key_shown_once_that_works_until_revoked(
    page: Page, live_server: LiveServer, operator: User
):
    log_in(page, live_server, operator, "/console/tenants/")
    page.click("text=New tenant")
    page.fill("#id_slug", "initech")
    page.fill("#id_name", "Initech")
    page.fill("#id_quota_units", "12")
    page.check("input[name=allowed_classes][value=interactive]")  # granted, not a default
    page.click("button:has-text('Create tenant')")
    expect(page.locator("h1")).to_contain_text("Initech")
    expect(page.locator(".facts")).to_contain_text("12 units = 3.0 GiB")

    page.fill("#id_name", "web backend")
    page.select_option("#id_default_class", "interactive")
    page.click("button:has-text('Create key')")
    raw_key = page.inner_text("#raw-key").strip()
    assert re.fullmatch(r"gs-\S{20,}", raw_key)
    screenshot(page, "key-created")
    assert _whoami(live_server, raw_key) == 200

    page.click("text=Done, back to initech")
    expect(page.locator("#keys")).to_contain_text("web backend")
    assert raw_key not in page.content()
    screenshot(page, "tenant-page")

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#keys button:has-text('Revoke')")
    expect(page.locator(".messages")).to_contain_text("revoked")
    expect(page.locator("#keys tbody tr").first).to_contain_text("revoked")
    assert ApiKey.objects.get(name="web backend").revoked_at is not None
    assert _whoami(live_server, raw_key) == 401


def _whoami(live_server: LiveServer, raw_key: str) -> int:
    response = httpx.get(f"{live_server.url}/v1/me", headers={"Authorization": f"Bearer {raw_key}"})
    return response.status_code


def test_a_bad_quota_is_refused_with_the_error_by_its_field(
    page: Page, live_server: LiveServer, operator: User, tenants: list[Tenant]
):
    log_in(page, live_server, operator, "/console/tenants/acme/")
    page.click("text=Edit quota and limits")
    page.fill("#id_quota_units", "-5")
    page.fill("#id_weight", "0")
    page.click("button:has-text('Save')")

    quota = page.locator(".field", has=page.locator("#id_quota_units"))
    weight = page.locator(".field", has=page.locator("#id_weight"))
    expect(quota.locator(".error")).to_contain_text("greater than or equal to 0")
    expect(weight.locator(".error")).to_contain_text("Weight must be greater than 0")
    expect(page.locator("#id_quota_units")).to_have_attribute("aria-invalid", "true")
    screenshot(page, "tenant-edit-error")
    tenants[0].refresh_from_db()
    assert tenants[0].quota_units == 8

    page.fill("#id_quota_units", "24")
    quota_gib = page.locator(".field", has=page.locator("#id_quota_units")).locator(
        ".units-preview"
    )
    expect(quota_gib).to_have_text("24 units = 6.0 GiB")  # htmx, as it is typed
    page.fill("#id_weight", "2.5")
    page.click("button:has-text('Save')")
    expect(page.locator(".messages")).to_contain_text("saved")
    expect(page.locator(".facts")).to_contain_text("24 units = 6.0 GiB")


def test_the_planner_computes_and_recomputes_live(
    page: Page, live_server: LiveServer, operator: User
):
    log_in(page, live_server, operator, "/console/planner/")
    concurrent = page.locator("#concurrent")
    expect(concurrent).to_have_text(re.compile(r"^\d+$"))
    llama_8b = int(concurrent.inner_text())
    assert llama_8b > 100
    expect(page.locator("#planner-result svg")).to_be_visible()
    screenshot(page, "planner")

    # htmx swaps the plan in place: Qwen2-7B has half the KV heads, so more requests fit.
    page.select_option("#id_preset", "qwen2-7b")
    expect(page.locator("#id_num_kv_heads")).to_have_value("4")
    expect(concurrent).not_to_have_text(str(llama_8b))
    assert int(concurrent.inner_text()) > llama_8b
    assert "preset=qwen2-7b" in page.url

    page.fill("#id_safety_factor", "0.95")
    page.locator("#id_safety_factor").dispatch_event("change")
    safety = page.locator(".field", has=page.locator("#id_safety_factor"))
    expect(safety.locator(".error")).to_contain_text("0.85")

    page.fill("#id_safety_factor", "0.8")
    page.fill("#id_peak_qps", "1000")
    page.locator("#id_peak_qps").dispatch_event("change")
    expect(page.locator("#gpus")).to_be_visible()
    gpus = int(page.inner_text("#gpus"))
    hot, cold = int(page.inner_text("#hot-gpus")), int(page.inner_text("#cold-gpus"))
    assert gpus == hot + cold
    assert hot >= 0.7 * gpus


@pytest.mark.parametrize(
    "section", ["Overview", "Engines", "Queues", "Batches", "Reports", "Find a request"]
)
def test_every_section_of_the_navigation_opens(
    page: Page, live_server: LiveServer, operator: User, section: str
):
    log_in(page, live_server, operator)
    page.click(f"nav >> text={section}")

    expect(page.locator("h1")).to_have_text(section)
    expect(page.locator("nav a[aria-current=page]")).to_have_text(section)
    screenshot(page, f"section-{section.lower().replace(' ', '-')}")


def test_a_request_is_found_by_the_id_its_answer_carried(
    page: Page, live_server: LiveServer, operator: User, tenants: list[Tenant]
):
    from datetime import UTC, datetime

    from tenants.models import UsageRecord

    UsageRecord.objects.create(
        request_id="4f1c0ffee", tenant=tenants[0], model="demo", request_class="standard",
        outcome="success", prompt_tokens=12, completion_tokens=30, latency_ms=420,
        finished_at=datetime.now(tz=UTC),
    )  # fmt: skip
    log_in(page, live_server, operator, "/console/requests/")
    page.fill("#request-id", "4f1c0ffee")
    page.click("#request-search button[type=submit]")
    expect(page.locator("#request-record")).to_contain_text("acme")
    expect(page.locator("#request-record")).to_contain_text("12 prompt + 30 completion")
    assert "id=4f1c0ffee" in page.url  # the address can be shared
    page.fill("#request-id", "nope")
    page.click("#request-search button[type=submit]")
    expect(page.locator("#request-missing")).to_contain_text("No request with that id")

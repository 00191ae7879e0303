"""A tenant's person in a real Chromium against the running platform and a real vLLM CPU
engine: signs in through a real OpenID Connect provider, makes a key and calls the API with
it (with a spending budget of its own), finds the call in usage and spend and by its
x-request-id, uploads and runs a batch and downloads its output, and revokes the key."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import browser, page, screenshot  # noqa: F401 - fixtures
from tests.e2e.conftest import MODEL, make_tenant
from tests.support.harness import Platform, free_port, restart_process
from tests.support.oidc_provider import Provider, start_provider

pytestmark = pytest.mark.browser

EMAIL = "pat@example.com"


@pytest.fixture
def sso_platform(
    platform_server: Platform, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Platform, Provider]]:
    """The platform's web process, started again with a provider's OIDC_* settings; as it
    was when done."""
    provider = start_provider(
        tmp_path_factory.mktemp("oidc"),
        port=free_port(avoid={platform_server.port}),
        redirect_uri=f"{platform_server.base_url}/portal/oidc/callback/",
        email=EMAIL,
    )
    try:
        restart_process(platform_server, "web", env=provider.platform_settings())
        yield platform_server, provider
    finally:
        provider.stop()
        restart_process(platform_server, "web")


def _chat(platform: Platform, key: str) -> httpx.Response:
    return httpx.post(
        f"{platform.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
        timeout=60,
    )


def _reload_until(tab: Page, selector: str, text: str, *, seconds: int) -> None:
    """Reloads the page until `selector` shows `text` (a page refreshes itself with htmx,
    whose script the platform serves from collected static files: the test does not rely on
    it)."""
    for _ in range(seconds):
        found = tab.locator(selector)
        if found.count() and text in found.inner_text():
            return
        tab.wait_for_timeout(1000)
        tab.reload()
    expect(tab.locator(selector)).to_contain_text(text)


def test_a_tenants_person_signs_in_makes_a_key_uses_it_runs_a_batch_and_revokes_it(
    sso_platform: tuple[Platform, Provider],
    page: Page,  # noqa: F811 - the browser tests' fixture, imported above
):
    platform, provider = sso_platform
    slug, _ = make_tenant(platform, classes="standard offline")
    platform.shell(
        "from tenants.models import Tenant; from tenants.memberships import invitation_create; "
        f"invitation_create(tenant=Tenant.objects.get(slug='{slug}'), email='{EMAIL}', "
        "role='member', invited_by=None); "
        # Every prompt token at 1: the call's spend is its prompt's length.
        f"from billing.services import price_set; price_set(model='{MODEL}', "
        "input_per_million=1000000); print(1)"
    )
    base = platform.base_url

    # Sign in: the portal sends the browser to the provider and back.
    page.goto(f"{base}/portal/login/")
    page.click("#sso-sign-in")
    page.fill("#id_username", provider.username)
    page.fill("#id_password", provider.password)
    page.click("#provider-sign-in")
    page.wait_for_url(f"{base}/portal/t/{slug}/")
    expect(page.locator("#classes")).to_have_text("standard, offline")

    # A key, shown once, that works.
    page.click("text=Keys")
    page.fill("#id_name", "browser")
    page.fill("#id_budget_amount", "100")
    page.click("#key-form button[type=submit]")
    key = page.locator("#raw-key").inner_text()
    answer = _chat(platform, key)
    assert answer.status_code == 200, answer.text
    request_id = answer.headers["x-request-id"]

    # The call in usage and by its id (the ledger is written within seconds).
    page.goto(f"{base}/portal/t/{slug}/requests/?id={request_id}")
    _reload_until(page, "#request-record", MODEL, seconds=30)
    page.goto(f"{base}/portal/t/{slug}/usage/")
    expect(page.locator("#today-requests")).to_have_text("1")
    expect(page.locator("#by-api_key")).to_contain_text("browser")
    prompt_tokens = answer.json()["usage"]["prompt_tokens"]
    expect(page.locator("#today-spend")).to_have_text(f"{prompt_tokens}.0000 USD")
    expect(page.locator("#budgets")).to_contain_text("100.00 USD")
    screenshot(page, "portal-usage")

    # A batch: upload, run, watch, download.
    line = {"custom_id": "portal-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "max_tokens": 8,
                     "messages": [{"role": "user", "content": "Hi"}]}}  # fmt: skip
    page.goto(f"{base}/portal/t/{slug}/batches/")
    page.set_input_files(
        "#id_file",
        {"name": "in.jsonl", "mimeType": "application/jsonl",
         "buffer": (json.dumps(line) + "\n").encode()},
    )  # fmt: skip
    page.select_option("#id_endpoint", "/v1/chat/completions")
    page.click("#batch-form button[type=submit]")
    _reload_until(page, "#batch-status", "completed", seconds=90)
    output = page.request.get(f"{base}{page.locator('#output-link').get_attribute('href')}")
    assert json.loads(output.text())["custom_id"] == "portal-1"

    # Revoked, the key stops working.
    page.goto(f"{base}/portal/t/{slug}/keys/")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#keys button:has-text('Revoke')")
    expect(page.locator("#keys .state").first).to_have_text("revoked")
    assert _chat(platform, key).status_code == 401

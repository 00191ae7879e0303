"""Headless Chromium for the console's browser tests, driven by Playwright.

The browser is Debian's `chromium` (scripts/ensure_chromium.sh installs it), never one that
Playwright downloads. Screenshots of every page visited go to GPUSHARE_BROWSER_ARTIFACTS
(default var/test-artifacts/browser/).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, sync_playwright
from pytest_django.live_server_helper import LiveServer

from staff.roles import Role, role_assign

CHROMIUM = os.environ.get("GPUSHARE_CHROMIUM", "/usr/bin/chromium")
# Offline and quiet: no updates, no sync, no QUIC probing, no GPU in a container.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(
    os.environ.get("GPUSHARE_BROWSER_ARTIFACTS", settings.BASE_DIR / "var/test-artifacts/browser")
)
STAFF_PASSWORD = "pw-browser-operator"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Per module, not per session: Playwright's event loop must be gone before tests that
    # are not browser tests run in this thread (Django's sync test client refuses to run
    # async middleware beside a running loop).
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"No Chromium at {CHROMIUM}: run scripts/ensure_chromium.sh "
            "(or point GPUSHARE_CHROMIUM at one)."
        )
    # Playwright's sync API keeps an event loop running in this thread, so Django's guard
    # against ORM calls from async code would refuse the tests' own database access.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def operator(transactional_db: None) -> User:
    user = User.objects.create_user(
        "browser-operator", "bo@example.com", STAFF_PASSWORD, is_staff=True
    )
    role_assign(user=user, role=Role.ADMIN)  # the pages' every action
    return user


def log_in(page: Page, live_server: LiveServer, user: User, path: str = "/console/") -> None:
    """Through the real login form, as a person would."""
    page.goto(f"{live_server.url}{path}")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", STAFF_PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}{path}")


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path

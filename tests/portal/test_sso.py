"""Signing in to the portal through a real OpenID Connect provider (django-oidc-provider in
a subprocess): the invited person lands in their tenant; staff and strangers get no tenant."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest
from django.test import Client

from tenants.memberships import invitation_create
from tenants.models import Membership
from tests.support.harness import free_port
from tests.support.oidc_provider import Provider, start_provider

pytestmark = pytest.mark.django_db

CALLBACK = "http://testserver/portal/oidc/callback/"


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    workdir: Path = tmp_path_factory.mktemp("oidc")
    running = start_provider(
        workdir, port=free_port(), redirect_uri=CALLBACK, email="pat@example.com"
    )
    yield running
    running.stop()


@pytest.fixture
def sso(provider: Provider, settings) -> Provider:
    for name, value in provider.platform_settings().items():
        setattr(settings, name, value)
    return provider


def _sign_in_at_the_provider(provider: Provider, authorize_url: str) -> str:
    """What a browser does at the provider: its login form, then back to the platform with
    a code. Returns the platform's callback URL."""
    with httpx.Client(timeout=10) as browser:
        answer = browser.get(authorize_url)
        login_url = urljoin(provider.base_url, answer.headers["location"])
        form = browser.get(login_url).text
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert csrf is not None, form
        answer = browser.post(
            login_url,
            data={
                "username": provider.username,
                "password": provider.password,
                "csrfmiddlewaretoken": csrf.group(1),
            },
        )  # the login page's own ?next= leads back to the authorization
        answer = browser.get(urljoin(provider.base_url, answer.headers["location"]))
        callback = answer.headers.get("location", answer.text)
        assert callback.startswith(CALLBACK), callback
        return callback


def test_an_invited_person_signs_in_through_the_provider_into_their_tenant(sso, owner):
    invitation_create(tenant=owner, email="pat@example.com", role="member", invited_by=None)
    client = Client()
    start = client.get("/portal/oidc/authenticate/")
    assert start["Location"].startswith(f"{sso.base_url}/openid/authorize")

    callback = _sign_in_at_the_provider(sso, start["Location"])
    landed = client.get(callback.removeprefix("http://testserver"))

    assert landed.status_code == 302
    assert landed["Location"] == "/portal/"
    assert client.get("/portal/")["Location"] == "/portal/t/acme/"
    assert client.get("/portal/t/acme/keys/").status_code == 200
    membership = Membership.objects.get(tenant=owner)
    assert membership.user.email == "pat@example.com"
    assert not membership.user.is_staff


def test_someone_not_invited_signs_in_to_no_tenant_and_a_staff_address_not_at_all(sso, owner):
    client = Client()
    start = client.get("/portal/oidc/authenticate/")
    landed = client.get(_sign_in_at_the_provider(sso, start["Location"]))
    assert landed["Location"] == "/portal/"
    assert 'id="no-tenants"' in client.get("/portal/").content.decode()
    assert client.get("/portal/t/acme/").status_code == 404

    from django.contrib.auth.models import User

    User.objects.filter(email="pat@example.com").update(is_staff=True)
    staff = Client()
    start = staff.get("/portal/oidc/authenticate/")
    refused = staff.get(_sign_in_at_the_provider(sso, start["Location"]))
    assert refused.status_code in (302, 400)
    assert "_auth_user_id" not in staff.session

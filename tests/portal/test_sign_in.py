"""Signing in to the portal without single sign-on (an invitation's link and a password),
and how the SSO backend maps a provider's claims to tenants."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal.sso import TenantOidcBackend
from tenants.memberships import invitation_create, membership_grant
from tenants.models import MemberRole, Membership
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def test_an_invitation_link_makes_an_account_once_and_signs_it_in(owner):
    issued = invitation_create(
        tenant=owner, email="Dana@Example.com", role="viewer", invited_by=None
    )
    client = Client()
    link = f"/portal/invitations/{issued.token}/"
    answer = client.post(link, {"username": "dana", "password": "a-long-passphrase"})
    assert answer["Location"] == "/portal/t/acme/"
    membership = Membership.objects.get(user__username="dana")
    assert (membership.tenant, membership.role, membership.user.email) == (
        owner, "viewer", "dana@example.com",
    )  # fmt: skip
    assert client.get("/portal/t/acme/keys/").status_code == 200
    # The link is used: a second visitor cannot take it.
    assert Client().get(link).status_code == 404
    # The password signs in again.
    again = Client()
    answer = again.post("/portal/login/", {"username": "dana", "password": "a-long-passphrase"})
    assert answer["Location"] == "/portal/"


def test_with_sso_configured_the_sign_in_page_offers_only_the_provider(settings):
    settings.OIDC_RP_CLIENT_ID = "gpushare"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = "https://idp.example.com/authorize"
    page = Client().get("/portal/login/").content.decode()
    assert 'id="sso-sign-in"' in page
    assert 'id="password-sign-in"' not in page
    User.objects.create_user("erin", "erin@example.com", "a-long-passphrase")
    answer = Client().post("/portal/login/", {"username": "erin", "password": "a-long-passphrase"})
    assert answer["Location"] == "/portal/login/"  # refused: not signed in


def test_the_tenant_claim_and_invitations_map_a_person_to_tenants(owner, settings):
    settings.GPUSHARE_OIDC_TENANT_CLAIM = "groups"
    other = TenantFactory.create(slug="initech")
    invitation_create(tenant=other, email="fay@example.com", role="owner", invited_by=None)
    backend = TenantOidcBackend()
    claims = {"email": "fay@example.com", "groups": ["acme", "not-a-tenant"]}
    assert backend.verify_claims(claims)
    user = backend.create_user(claims)
    roles = dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role"))
    assert roles == {"acme": "member", "initech": "owner"}
    assert not user.has_usable_password()
    # A grant never lowers a role a person holds.
    membership_grant(user=user, tenant=owner, role=MemberRole.OWNER)
    backend.update_user(user, claims)
    assert Membership.objects.get(user=user, tenant=owner).role == "owner"


def test_staff_and_unverified_addresses_never_sign_in_through_sso():
    User.objects.create_user("sam", "sam@example.com", "pw", is_staff=True)
    backend = TenantOidcBackend()
    assert not backend.verify_claims({"email": "SAM@example.com"})
    assert not backend.verify_claims({"email": "gus@example.com", "email_verified": False})
    assert backend.verify_claims({"email": "gus@example.com", "email_verified": True})

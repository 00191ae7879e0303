"""Single sign-on for tenants' people: OpenID Connect through mozilla-django-oidc, with
people mapped to tenants by their invitations (the provider's verified email) or by a claim
(GPUSHARE_OIDC_TENANT_CLAIM). Staff never sign in this way: their password sign-in at
/admin/login/ stays the only one, so an identity provider cannot make anyone staff."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import QuerySet
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from tenants.memberships import invitations_accept_for_email, memberships_from_claim


def sso_enabled() -> bool:
    """Whether an OpenID Connect provider is configured (docs/SSO.md)."""
    return bool(settings.OIDC_RP_CLIENT_ID and settings.OIDC_OP_AUTHORIZATION_ENDPOINT)


def claimed_tenants(claims: dict[str, Any]) -> list[str]:
    """The tenant slugs the configured claim names: a string (comma- or space-separated) or
    a list of strings; none when no claim is configured."""
    name = settings.GPUSHARE_OIDC_TENANT_CLAIM
    value = claims.get(name) if name else None
    if isinstance(value, str):
        return [part for part in value.replace(",", " ").split() if part]
    if isinstance(value, list):
        return [part for part in value if isinstance(part, str) and part]
    return []


class TenantOidcBackend(OIDCAuthenticationBackend):
    """Signs a person in by the provider's email claim and puts them in their tenants."""

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        email = claims.get("email")
        if not email or claims.get("email_verified") is False:
            return False  # invitations go to addresses: only a verified one may take them
        staff = User.objects.filter(email__iexact=email, is_staff=True)
        return not staff.exists()

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[Any]:
        users: QuerySet[Any] = super().filter_users_by_claims(claims)
        return users.filter(is_staff=False, is_active=True)

    def create_user(self, claims: dict[str, Any]) -> User:
        user: User = super().create_user(claims)
        user.set_unusable_password()
        user.save(update_fields=["password"])
        return self.update_user(user, claims)

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        """At each sign-in: open invitations of the address are accepted, and the claim's
        tenants granted (a grant never lowers a role; leaving the claim removes nothing)."""
        invitations_accept_for_email(user=user, email=str(claims["email"]))
        memberships_from_claim(
            user=user, slugs=claimed_tenants(claims), role=settings.GPUSHARE_OIDC_TENANT_ROLE
        )
        return user

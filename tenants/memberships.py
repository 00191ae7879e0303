"""People in tenants: memberships with a role, and owners' invitations by email.

An invitation's token is 256 random bits shown once as a link; only its SHA-256 is stored.
Anything a person reads in the tenant portal is found through one of their memberships.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from plumbing.errors import NotFound
from tenants.keys import hash_key
from tenants.models import Invitation, MemberRole, Membership, Tenant

# The roles' order: a grant never lowers a role a person already holds.
_RANK = {MemberRole.VIEWER: 0, MemberRole.MEMBER: 1, MemberRole.OWNER: 2}


@dataclass(frozen=True)
class IssuedInvitation:
    """An invitation just made: the only moment its token exists outside the invitee's link."""

    invitation: Invitation
    token: str


def membership_list(*, user: User | AnonymousUser) -> QuerySet[Membership]:
    if not user.is_authenticated:
        return Membership.objects.none()
    return Membership.objects.filter(user=user, tenant__is_active=True).select_related("tenant")


def membership_get(*, user: User | AnonymousUser, slug: str) -> Membership:
    """The person's membership of the tenant `slug`. A tenant they are not in is 'not found',
    never revealed."""
    found = membership_list(user=user).filter(tenant__slug=slug).first()
    if found is None:
        raise NotFound(f"No tenant '{slug}'.")
    return found


@transaction.atomic
def membership_grant(*, user: User, tenant: Tenant, role: str) -> Membership:
    """Puts the person in the tenant with `role`, or raises the role they hold to it."""
    if role not in MemberRole.values:
        raise ValidationError({"role": f"Unknown role {role!r}; choose from {MemberRole.values}."})
    membership, created = Membership.objects.select_for_update().get_or_create(
        user=user, tenant=tenant, defaults={"role": role}
    )
    if not created and _RANK[MemberRole(role)] > _RANK[MemberRole(membership.role)]:
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def member_list(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user")


def invitation_create(
    *, tenant: Tenant, email: str, role: str, invited_by: User | None
) -> IssuedInvitation:
    """An invitation of `email` into the tenant, open for GPUSHARE_PORTAL_INVITATION_DAYS."""
    email = email.strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationError({"email": f"'{email}' is not an email address."}) from None
    if role not in MemberRole.values:
        raise ValidationError({"role": f"Unknown role {role!r}; choose from {MemberRole.values}."})
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        tenant=tenant,
        email=email,
        role=role,
        hashed_token=hash_key(token),
        invited_by=invited_by,
        expires_at=timezone.now() + timedelta(days=settings.GPUSHARE_PORTAL_INVITATION_DAYS),
    )
    return IssuedInvitation(invitation=invitation, token=token)


def invitation_list(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(tenant=tenant, accepted_at__isnull=True)


def invitation_get(*, token: str) -> Invitation:
    """The open invitation of a link's token; NotFound for an unknown, used or expired one."""
    invitation = (
        Invitation.objects.select_related("tenant").filter(hashed_token=hash_key(token)).first()
    )
    if invitation is None or not invitation.is_open(timezone.now()):
        raise NotFound("This invitation is unknown, used or expired; ask for a new one.")
    return invitation


@transaction.atomic
def invitation_accept(*, invitation: Invitation, user: User) -> Membership:
    """The person joins the invitation's tenant with its role; the invitation is used."""
    locked = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if not locked.is_open(timezone.now()):
        raise NotFound("This invitation is unknown, used or expired; ask for a new one.")
    locked.accepted_at = timezone.now()
    locked.save(update_fields=["accepted_at"])
    return membership_grant(user=user, tenant=locked.tenant, role=locked.role)


def invitations_accept_for_email(*, user: User, email: str) -> list[Membership]:
    """Every open invitation of `email` (one the identity provider has verified), accepted."""
    now = timezone.now()
    found = Invitation.objects.filter(email__iexact=email.strip(), accepted_at__isnull=True)
    return [
        invitation_accept(invitation=invitation, user=user)
        for invitation in found.select_related("tenant")
        if invitation.is_open(now)
    ]


def memberships_from_claim(*, user: User, slugs: Iterable[str], role: str) -> list[Membership]:
    """Memberships of the active tenants whose slugs the identity provider's claim names
    (unknown ones are left out: the claim may name groups that are not tenants)."""
    tenants = Tenant.objects.filter(slug__in=list(slugs), is_active=True)
    return [membership_grant(user=user, tenant=tenant, role=role) for tenant in tenants]

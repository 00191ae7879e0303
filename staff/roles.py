"""The staff's roles: each a Django group of permissions, each role holding the one below it.

- viewer: reads the console and the admin API, but no tenant's batch files or request bodies.
- operator: and runs engines, cancels batches, changes tenants' quotas and limits.
- admin: and tenants' keys and access (classes, models, extra fields, cache group), reading
  tenants' data, staff users and roles, the admin API's tokens, prices, and every model in
  the Django admin.

Operators set tenants' money budgets (limits, like token budgets); every role reads spend and
the audit log.

A superuser holds every permission without a group. A staff user in no role's group is
refused everything (403), so a new staff user reads nothing until given a role.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.db import transaction


class Perm(StrEnum):
    """The permissions the console and the admin API check, as `user.has_perm` takes them."""

    VIEW = "staff.view_platform"
    OPERATE_ENGINES = "staff.operate_engines"
    CANCEL_BATCHES = "staff.cancel_batches"
    CHANGE_TENANT_LIMITS = "staff.change_tenant_limits"
    CHANGE_TENANT_ACCESS = "staff.change_tenant_access"
    MANAGE_KEYS = "staff.manage_keys"
    READ_TENANT_DATA = "staff.read_tenant_data"
    MANAGE_STAFF = "staff.manage_staff"
    # Billing's own model permission: the admin role holds every model's (sync_role_groups).
    CHANGE_PRICES = "billing.change_price"

    @property
    def codename(self) -> str:
        return self.value.split(".", 1)[1]


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


_VIEWER = (Perm.VIEW,)
_OPERATOR = (*_VIEWER, Perm.OPERATE_ENGINES, Perm.CANCEL_BATCHES, Perm.CHANGE_TENANT_LIMITS)
_ADMIN = (
    *_OPERATOR,
    Perm.CHANGE_TENANT_ACCESS,
    Perm.MANAGE_KEYS,
    Perm.READ_TENANT_DATA,
    Perm.MANAGE_STAFF,
    Perm.CHANGE_PRICES,
)
ROLE_PERMISSIONS: dict[Role, tuple[Perm, ...]] = {
    Role.VIEWER: _VIEWER,
    Role.OPERATOR: _OPERATOR,
    Role.ADMIN: _ADMIN,
}
# A tenant's fields `Perm.CHANGE_TENANT_LIMITS` changes; its others (name, activation,
# classes, models, extra request fields, cache group) need `Perm.CHANGE_TENANT_ACCESS`.
TENANT_LIMIT_FIELDS = frozenset(
    ("weight", "quota_units", "burst_units", "rpm_limit", "tpm_limit", "token_budget",
     "budget_period")
)  # fmt: skip
# The highest first: a user in two roles' groups holds the higher one's permissions.
ROLES_DOWN = (Role.ADMIN, Role.OPERATOR, Role.VIEWER)
SUPERUSER = "superuser"


def sync_role_groups(*, using: str = "default") -> None:
    """Each role's group with exactly its permissions; the admin's with every model
    permission too (the Django admin's). Idempotent: runs after every `migrate`."""
    from django.contrib.auth.models import Group, Permission

    staff_perms = Permission.objects.using(using).filter(content_type__app_label="staff")
    by_codename = {p.codename: p for p in staff_perms}
    with transaction.atomic(using=using):
        for role, perms in ROLE_PERMISSIONS.items():
            group, _ = Group.objects.using(using).get_or_create(name=role.value)
            wanted = [by_codename[p.codename] for p in perms if p.codename in by_codename]
            if role is Role.ADMIN:
                wanted += list(
                    Permission.objects.using(using).exclude(content_type__app_label="staff")
                )
            group.permissions.set(wanted)


def role_assign(*, user: Any, role: Role) -> None:
    """Puts a staff user in one role (out of the others') and marks it staff."""
    from django.contrib.auth.models import Group

    with transaction.atomic():
        user.groups.remove(*Group.objects.filter(name__in=[r.value for r in Role]))
        user.groups.add(Group.objects.get(name=role.value))
        if not user.is_staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])


def role_remove(*, user: Any) -> None:
    """Takes every role from a user and its staff mark: it reaches neither the console nor
    the admin API (its tokens stay, and open nothing while it is not staff)."""
    from django.contrib.auth.models import Group

    with transaction.atomic():
        user.groups.remove(*Group.objects.filter(name__in=[r.value for r in Role]))
        user.is_staff = False
        user.save(update_fields=["is_staff"])


def role_of(user: Any) -> str | None:
    """The user's role's name, `superuser`, or None (no role: refused everything)."""
    if getattr(user, "is_superuser", False):
        return SUPERUSER
    names = set(user.groups.values_list("name", flat=True)) if user.is_authenticated else set()
    return next((r.value for r in ROLES_DOWN if r.value in names), None)

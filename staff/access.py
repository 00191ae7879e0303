"""Checking a role's permission: the console's views (a decorator) and the admin API's (a DRF
permission class). Both refuse anyone who is not active staff, and staff without the
permission the view names for what it does."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from staff.roles import Perm, role_of

if TYPE_CHECKING:  # DRF's settings load this module while rest_framework.views loads
    from rest_framework.views import APIView

View = TypeVar("View", bound=Callable[..., Any])


def console_permission(perm: Perm) -> Callable[[View], View]:
    """A console view for staff holding `perm`: others who are not staff go to the login page,
    staff without it get Django's 403. The view keeps the permission in `required_perm`."""

    def decorate(view: View) -> View:
        checked = staff_member_required(permission_required(perm.value, raise_exception=True)(view))
        checked.required_perm = perm  # type: ignore[attr-defined]
        return checked

    return decorate


class RolePermission(BasePermission):
    """The admin API's permission check: a view names the permission of each method it serves
    in `required_perms` ({"POST": Perm.MANAGE_KEYS}); a read it does not name needs
    `Perm.VIEW`, and a write it does not name is refused to everyone, superusers included,
    so a new view that forgets to name one cannot change anything."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            return False  # DRF answers 401 without credentials, 403 with a user's
        method = request.method or "GET"
        named: dict[str, Perm] = getattr(view, "required_perms", {})
        required = named.get(method) or (named.get("GET") if method == "HEAD" else None)
        if required is None and method in SAFE_METHODS:
            required = Perm.VIEW
        if required is None:
            raise PermissionDenied(f"{method} names no permission here; nobody may send it.")
        if not user.has_perm(required.value):
            role = role_of(user) or "no"
            raise PermissionDenied(f"The {role} role does not hold {required.value}.")
        return True


def require(request: Request, perm: Perm) -> None:
    """Inside an admin API view: 403 unless the user holds `perm` too (a field that needs a
    higher role than the method)."""
    if not request.user.has_perm(perm.value):
        role = role_of(request.user) or "no"
        raise PermissionDenied(f"The {role} role does not hold {perm.value}.")

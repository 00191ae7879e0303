"""Who may see a tenant's portal pages: a signed-in person with a membership of the tenant
in the URL. Every page finds its tenant through that membership, so a tenant a person is
not in answers 404, as if it did not exist; a viewer's write answers 403."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponseBase

from plumbing.errors import NotFound
from tenants.memberships import membership_get
from tenants.models import Membership

PortalView = Callable[..., HttpResponseBase]
LOGIN_PATH = "/portal/login/"


def portal_page(*, write: bool = False, invite: bool = False) -> Callable[[PortalView], Any]:
    """A page of the tenant `slug`: the view gets the person's membership after the request.
    `write`: owners and members only; `invite`: owners only."""

    def decorate(view: PortalView) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def checked(request: HttpRequest, slug: str, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path(), LOGIN_PATH)
            try:
                membership = membership_get(user=request.user, slug=slug)
            except NotFound as exc:
                raise Http404(str(exc)) from None
            if (write and not membership.can_write) or (invite and not membership.can_invite):
                raise PermissionDenied(f"A {membership.role} of '{slug}' may not do this.")
            return view(request, membership, *args, **kwargs)

        return checked

    return decorate


def page_context(membership: Membership, section: str, **extra: Any) -> dict[str, Any]:
    return {"membership": membership, "tenant": membership.tenant, "section": section, **extra}

"""The people page: the tenant's members and open invitations; owners invite by email."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.access import page_context, portal_page
from portal.forms import InviteForm
from tenants.memberships import invitation_create, invitation_list, member_list
from tenants.models import Membership


def _render(
    request: HttpRequest, membership: Membership, form: InviteForm, **extra: object
) -> HttpResponse:
    tenant = membership.tenant
    context = page_context(
        membership,
        "members",
        members=member_list(tenant=tenant),
        invitations=invitation_list(tenant=tenant),
        form=form,
        **extra,
    )
    return render(request, "portal/members.html", context)


@portal_page()
def members(request: HttpRequest, membership: Membership) -> HttpResponse:
    return _render(request, membership, InviteForm())


@portal_page(invite=True)
@require_POST
def invite(request: HttpRequest, membership: Membership) -> HttpResponse:
    """Makes an invitation and shows its link once (the owner sends it)."""
    form = InviteForm(request.POST)
    if form.is_valid():
        try:
            issued = invitation_create(
                tenant=membership.tenant, invited_by=membership.user, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_error(None, exc.messages)
        else:
            link = request.build_absolute_uri(reverse("portal:invitation", args=[issued.token]))
            return _render(request, membership, InviteForm(), link=link, invited=issued.invitation)
    return _render(request, membership, form)

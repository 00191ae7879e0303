"""Find one of the tenant's requests by its id (the `x-request-id` its answer carried)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.access import page_context, portal_page
from tenants import selectors
from tenants.models import Membership

# A request id as the platform makes them is 32 hex digits: anything longer is nobody's.
REQUEST_ID_MAX_CHARS = 64


@portal_page()
def request_lookup(request: HttpRequest, membership: Membership) -> HttpResponse:
    """The ledger row of a request of this tenant; another tenant's id is not found."""
    request_id = request.GET.get("id", "").strip()
    record = None
    if request_id and len(request_id) <= REQUEST_ID_MAX_CHARS:
        record = selectors.usage_record_find(tenant=membership.tenant, request_id=request_id)
    context = page_context(membership, "requests", request_id=request_id, record=record)
    return render(request, "portal/request_lookup.html", context)
